from ordrec.service.serving.cli import main

raise SystemExit(main())
