from ordrec.trainer.cli import main

raise SystemExit(main())
