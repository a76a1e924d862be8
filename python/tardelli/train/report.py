"""What a training run shows and leaves behind: the progress bar, the log lines, the metrics
file (one JSON object per step) and the loss-curve PNG."""
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


def format_log_line(rec, steps):
    line = (f"step {rec['step']:>6}/{steps} | loss {rec['loss']:.4f} | lr {rec['lr']:.3e} | "
            f"grad norm {rec['grad_norm']:.3f} | {rec['tokens_per_s']:,.0f} tok/s | "
            f"mfu {100 * rec['mfu']:.1f}% | mem {rec['mem_bytes'] / 2**20:.0f} MiB")
    if "moe_aux_loss" in rec:
        line += (f" | moe aux {rec['moe_aux_loss']:.3f} z {rec['moe_z_loss']:.3f} "
                 f"max load {rec['moe_max_load']:.2f}x dropped {rec['moe_dropped_tokens']}")
    if "loss_scale" in rec:
        line += f" | loss scale {rec['loss_scale']:g}" + (" (skipped)" if rec["skipped"] else "")
    elif rec.get("skipped"):
        line += " | skipped"
    if rec.get("nonfinite_skips"):
        line += f" | non-finite skips {rec['nonfinite_skips']}"
    if "val_loss" in rec:
        line += f" | val loss {rec['val_loss']:.4f}"
    return line


class MetricsFile:
    """Appends one JSON object per step (flushed, so a crash loses at most the current line).
    A resumed run drops the lines of steps after the checkpoint it resumed from, so the file
    always describes one history; with append=True (a restarted attempt of a supervised run,
    Note [Supervised metrics] in trainer.py) it keeps them and adds its own after, so a step
    may have several rows: effective_rows gives the history."""

    def __init__(self, path, resume_step=None, append=False):
        self.path = path
        if not path:
            self._f = None
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if append:
            self._f = open(path, "a")
        elif resume_step is not None and os.path.exists(path):
            kept = [r for r in read_metrics(path) if r["step"] <= resume_step]
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                for r in kept:
                    f.write(json.dumps(r) + "\n")
            os.replace(tmp, path)
            self._f = open(path, "a")
        else:
            self._f = open(path, "w")

    def write(self, rec):
        if self._f is not None:
            self._f.write(json.dumps(rec) + "\n")
            self._f.flush()

    def close(self):
        if self._f is not None:
            self._f.close()


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
