"""What the digits experiments' run.py scripts share: running a command with its output in the error, writing a CSV, and splicing a generated block into a README."""

import csv
import subprocess

def sh(args, what, timeout, cwd=None):
    """Runs a command; raises with its output when it fails; returns its stdout."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def write_csv(path, rows):
    """Rows (dicts) as CSV; the columns are the last row's (the fullest), missing cells empty."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[-1]), restval="")
        writer.writeheader()
        writer.writerows(rows)


def splice_readme(path, lines, block="results"):
    """Replaces what lies between the README's `<!-- BLOCK:begin -->` and `<!-- BLOCK:end -->`
    markers with `lines`."""
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    text = path.read_text()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    path.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
