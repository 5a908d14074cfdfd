import sys

from controller.service import main

sys.exit(main())
