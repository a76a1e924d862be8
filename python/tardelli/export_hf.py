"""python -m tardelli.export_hf: a training checkpoint -> a Hugging Face GPT-2 directory
(config.json, model.safetensors, and the tokenizer's vocab.json/merges.txt when the checkpoint
has them), loadable with transformers' GPT2LMHeadModel / GPT2TokenizerFast.

    python -m tardelli.export_hf --checkpoint runs/demo --output runs/demo-hf
"""
import argparse
import os
import shutil
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tardelli.export_hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="step directory or --save root")
    p.add_argument("--output", required=True, help="directory to write")
    a = p.parse_args(argv)
    from .generate import resolve_checkpoint
    from .train import state
    try:
        step_dir = resolve_checkpoint(a.checkpoint)
        model, _ = state.load_model(step_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"python -m tardelli.export_hf: error: {e}", file=sys.stderr)
        return 2
    if model.config.arch != "gpt2":
        print(f"python -m tardelli.export_hf: error: {step_dir} is a {model.config.arch} model; "
              "only gpt2 checkpoints map onto Hugging Face's GPT-2", file=sys.stderr)
        return 2
    model.save_hf(a.output)
    for f in ("vocab.json", "merges.txt"):
        src = os.path.join(step_dir, f)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(a.output, f))
    print(f"export_hf: wrote {a.output} from {step_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
