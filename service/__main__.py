from ordrec.service.cli import main

raise SystemExit(main())
