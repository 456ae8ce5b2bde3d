import sys

from lu_client._cli import main

sys.exit(main())
