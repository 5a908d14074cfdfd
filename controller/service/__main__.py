import sys

from controller.service.server import main

sys.exit(main())
