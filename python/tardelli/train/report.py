"""The Python front end's share of what a training run shows and leaves behind: the progress
bar, reading the metrics file (one JSON object per step, written by the C++ loop's MetricsFile,
include/tardelli/train/metrics_file.h) and the loss-curve PNG."""
import json
import math
import os
import sys


class Progress:
    """A tqdm bar over optimizer steps when available and wanted; log lines go through it so
    they do not break the bar."""

    def __init__(self, total, initial, enabled):
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                                 file=sys.stderr, leave=True)
            except ImportError:
                pass

    @property
    def active(self):
        """Whether a bar is shown (log lines then go through write())."""
        return self._bar is not None

    def update(self, loss):
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self._bar.update(1)

    def write(self, line):
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def read_metrics(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def effective_rows(records):
    """The history a metrics file describes: for each step, its last row (a restarted attempt
    repeats the steps after its checkpoint), in step order; event rows ({"event": ...}, such as
    a supervised restart's) are left out."""
    last = {}
    for r in records:
        if "event" not in r:
            last[r["step"]] = r
    return [last[s] for s in sorted(last)]


def plot_loss(records, path, title=""):
    """Writes the training (and validation) loss against the step as a PNG; returns False when
    matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = effective_rows(records)
    steps = [r["step"] for r in records]
    loss = [r["loss"] for r in records]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, loss, lw=1, label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", lw=1.5, ms=3, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def plot_loss_isolated(metrics_path, path, title="", timeout=120):
    """plot_loss in a child Python that does not load tardelli: a plotting library that crashes
    (seen once: matplotlib's import segfaulted at the end of a CUDA run) costs the picture, not
    the finished run. Returns (True, "") when the PNG was written, else (False, reason)."""
    import subprocess
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--plot", metrics_path,
                            path, title], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"loss plot not drawn: {e}"
    if r.returncode == 0:
        return True, ""
    if r.returncode == 3:
        return False, "loss plot not drawn: matplotlib is not installed"
    why = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
    tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    return False, f"loss plot not drawn: the plotting process failed ({why})" + \
        (f": {tail[0]}" if tail else "")


def unigram_entropy(counts):
    """Entropy in nats of a token-frequency table: the loss of the best context-free model."""
    total = float(sum(counts))
    return -sum(c / total * math.log(c / total) for c in counts if c > 0)


if __name__ == "__main__":  # the child of plot_loss_isolated: report.py --plot METRICS PNG TITLE
    if len(sys.argv) != 5 or sys.argv[1] != "--plot":
        sys.exit("usage: report.py --plot METRICS_JSONL PNG TITLE")
    sys.exit(0 if plot_loss(read_metrics(sys.argv[2]), sys.argv[3], sys.argv[4]) else 3)
