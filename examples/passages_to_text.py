"""The passages of reading-comprehension data as a pretraining corpus: a "domain" source for `--sources`.

    python examples/passages_to_text.py squad/dev-v1.1.json RACE/ --output_dir domain/

Each SQuAD file (the official JSON) gives its paragraphs' contexts, each once; each RACE file (the official
layout's .txt files, or .json files of the same fields, in a folder at any depth) gives its article. They are written
to OUTPUT_DIR/<input name>.txt, one passage after another with a blank line between them: train on them with
`layout=blank_line_separated` in the source. Questions and answers are left out (a model that is later fine-tuned
on them should not have read them).
"""

import argparse
import json
import sys
from pathlib import Path


def squad_passages(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return list(dict.fromkeys(paragraph["context"].strip() for article in data for paragraph in article["paragraphs"]))


def race_passages(folder: Path) -> list[str]:
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".json") and p.is_file())
    return list(dict.fromkeys(json.loads(p.read_text(encoding="utf-8"))["article"].strip() for p in files))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="SQuAD .json files and RACE folders")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    for name in args.inputs:
        path = Path(name)
        try:
            passages = race_passages(path) if path.is_dir() else squad_passages(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            sys.exit(f"error: {path}: not a SQuAD file or a folder of RACE files ({error})")
        if not passages:
            sys.exit(f"error: {path}: no passage found")
        target = output / f"{path.stem or path.name}.txt"
        target.write_text("\n\n".join(" ".join(p.split()) for p in passages) + "\n", encoding="utf-8")
        print(f"{path}: {len(passages):,} passages -> {target}")


if __name__ == "__main__":
    main()
