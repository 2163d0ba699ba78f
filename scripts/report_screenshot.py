"""Render the report of a run to a PNG (the README's screenshot).

    python scripts/report_screenshot.py OUT.png [CKPT_DIR] [--full-page]

With CKPT_DIR: the report of the runs recorded there.  Without: a fresh
``python -m localcluster.run --epochs 5`` into a temporary directory
first.  The page is opened in headless Chromium (the tests' DevTools pipe
client, tests/_chromium.py) at 1280 x 900 CSS pixels; ``--full-page``
captures the whole page instead of the first screen.  Nothing is left
behind but OUT.png.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))

import _chromium  # noqa: E402  (a test helper, found through the path)
from localcluster.cli.report import write_report  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", metavar="OUT.png")
    parser.add_argument("ckpt", metavar="CKPT_DIR", nargs="?",
                        help="a run's checkpoint directory (default: run "
                             "the embedded job for 5 epochs first)")
    parser.add_argument("--full-page", action="store_true")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    if _chromium.find_binary() is None:
        parser.exit(2, f"no Chromium: {_chromium.INSTALL}\n")
    with tempfile.TemporaryDirectory(prefix="report-shot-") as tmp:
        ckpt = args.ckpt
        if ckpt is None:
            ckpt = os.path.join(tmp, "ckpt")
            subprocess.run([sys.executable, "-m", "localcluster.run",
                            "--epochs", "5", "--checkpoint-dir", ckpt],
                           check=True, timeout=300)
        try:
            page_path = write_report(ckpt, os.path.join(tmp, "report.html"))
        except FileNotFoundError as exc:
            parser.exit(2, f"{exc}\n")
        with _chromium.Chromium() as browser:
            page = browser.open(f"file://{page_path}", args.width,
                                args.height)
            png = page.screenshot(full_page=args.full_page)
            if browser.problems:
                print("the page reported:", *browser.problems, sep="\n  ",
                      file=sys.stderr)
    with open(args.out, "wb") as f:
        f.write(png)
    width, height = _chromium.png_size(png)
    print(f"{args.out}: {width} x {height}")


if __name__ == "__main__":
    main()
