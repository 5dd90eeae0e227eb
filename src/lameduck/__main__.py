from lameduck.cli import main

raise SystemExit(main())
