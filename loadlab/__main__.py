from loadlab.cli import main

raise SystemExit(main())
