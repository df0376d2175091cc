"""`python -m syncopate.capture`: runs the capture tool and exits with its status."""

import sys

from syncopate.capture import main

sys.exit(main())
