from agents.switch.main import main  # noqa: I001 - main sets the protobuf runtime first

import sys

sys.exit(main())
