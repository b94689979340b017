from trace_tools.cli import main

raise SystemExit(main())
