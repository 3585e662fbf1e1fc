from gpustation.cli import main

raise SystemExit(main())
