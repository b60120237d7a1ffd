"""Run ``python -m MODULE`` (argv[1]) and write the names in sys.modules to a file when it exits.

With them, how many objects the garbage collector holds frozen at exit.

Test-only: tests/test_startup.py starts the real server through this file to
see which modules a stdio start loaded. The server's exit runs exit handlers
before it leaves (cpersona.cli._leave), so this one sees the final state.
"""

import atexit
import os
import runpy
import sys


def _dump() -> None:
    import gc

    # How many objects the start froze too, as a token no module name can be (tests/test_startup.py).
    state = [f"#gc-frozen={gc.get_freeze_count()}"]
    with open(os.environ["CPERSONA_TEST_MODULES_FILE"], "w", encoding="utf-8") as out:
        out.write("\n".join(sorted(sys.modules) + state))


atexit.register(_dump)
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
