from conch.cli import main

raise SystemExit(main())
