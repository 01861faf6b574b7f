"""``python -m jaxlab.bench --ttft-child``: the fresh process that times the first token."""

import sys

from jaxlab.bench.ttft import child_main

sys.exit(child_main())
