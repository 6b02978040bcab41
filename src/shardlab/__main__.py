from shardlab.cli import main

raise SystemExit(main())
