"""Stand-in for the get-pip.py that `ansible-test --venv` downloads from a host CI cannot reach.

scripts/sanity puts it where ansible-test looks for a downloaded one first
(~/.ansible/test/cache/get_pip_<version>.py). Like get-pip.py it installs pip into the interpreter
that runs it (ansible-test's new venv), taking get-pip's arguments: the standard library's bundled
pip (ensurepip, offline), then the pip version ansible-test asked for, from the package index pip
is configured with.
"""

import ensurepip
import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")  # get-pip.py options that pip install does not know

ensurepip.bootstrap()
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet",
                          *(arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY)]))
