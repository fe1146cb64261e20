"""Start-up cost of the CLI and of `import mismatch`, side by side with `import torch` in one run.

Each command runs as a fresh process, 5 times, interleaved; the medians are printed with their ratio
to `import torch`. Targets (issue 23): `mismatch --help` and `mismatch models` ≤ 0.5 × `import torch`.
`import mismatch` loads its public names on first use, and the CLI imports the library inside each
command, so `--help` (and a usage error) cost typer's start-up only.

    python benchmarks/bench_cli.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import mismatch": [sys.executable, "-c", "import mismatch"],
    "mismatch --help": [str(BIN / "mismatch"), "--help"],
    "mismatch models": [str(BIN / "mismatch"), "models"],
}
REPEATS = 5


def main() -> None:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(REPEATS):  # interleaved: a slower moment of the machine hits every command alike
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    torch_s = statistics.median(times["import torch"])
    for name, values in times.items():
        median = statistics.median(values)
        target = " (target ≤ 0.5)" if name.startswith("mismatch ") else ""
        print(f"{name:18s} median {median:6.2f} s of {REPEATS} ({', '.join(f'{v:.2f}' for v in values)}), "
              f"{median / torch_s:5.2f} × import torch{target}")


if __name__ == "__main__":
    main()
