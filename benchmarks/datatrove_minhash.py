"""datatrove's four-stage MinHash deduplication, as its own example runs it, on JSONL files.

The peer `benchmarks/corpus.py --against datatrove` measures hanlm's corpus stage against: one
process (`LocalPipelineExecutor`, one worker), signatures and the filter in one task each, the
buckets in `num_buckets` tasks (datatrove requires one task per bucket at least), the clusters in
one; `MinhashConfig()`'s defaults (5-word shingles, 14 buckets of 8 hashes, 64-bit xxhash).
Documents are split into words by the tokenizer datatrove assigns Korean (`--words kiwi`:
`kor_Hang`, Kiwi, a morphological analyser, from kiwipiepy), or by its `WhitespaceTokenizer`
(`--words whitespace`: spaCy's multi-language tokenizer, its fallback for languages without
one), or by `str.split` (`--words split`: a WordTokenizer of the script's, through datatrove's
interface for custom tokenizers; the cheapest split there is, a lower bound on the pipeline's
cost). The ids datatrove kept go to `--kept`, one a line.

    python benchmarks/datatrove_minhash.py --work DIR --kept IDS.txt [--words kiwi] FILE...
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize`
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import gzip
import json
import shutil
from pathlib import Path


def run(inputs: list[Path], work: Path, words: str) -> list[str]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.typeshelper import Languages
    from datatrove.utils.word_tokenizers import WhitespaceTokenizer, WordTokenizer

    class SplitWords(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return text.splitlines()

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            raise NotImplementedError("MinHash splits words only")

    shutil.rmtree(work, ignore_errors=True)
    folder = str(inputs[0].parent)
    names = [p.name for p in inputs]
    if any(p.parent != inputs[0].parent for p in inputs):
        sys.exit("datatrove_minhash: the input files must be in one folder")
    config = MinhashConfig()

    work.mkdir(parents=True)
    paths_file = work / "inputs.txt"  # exactly these files, in this order
    paths_file.write_text("".join(f"{n}\n" for n in names), "utf-8")

    def reader():
        return JsonlReader(folder, paths_file=str(paths_file), compression=None)

    def executor(pipeline, tasks, name):
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1,
                                     logging_dir=str(work / "logs" / name),
                                     skip_completed=False)  # fmt: skip

    signatures, buckets, remove = (str(work / n) for n in ("signatures", "buckets", "remove"))
    # `language` is a language code or a WordTokenizer (datatrove's load_word_tokenizer)
    language = {"kiwi": Languages.korean__hang, "whitespace": WhitespaceTokenizer(),
                "split": SplitWords()}[words]  # fmt: skip
    signature = MinhashDedupSignature(output_folder=signatures, config=config, language=language)
    executor([reader(), signature], 1, "signatures").run()
    bucket_step = MinhashDedupBuckets(input_folder=signatures, output_folder=buckets,
                                      config=config)  # fmt: skip
    executor([bucket_step], config.num_buckets, "buckets").run()
    executor([MinhashDedupCluster(input_folder=buckets, output_folder=remove, config=config)],
             1, "clusters").run()  # fmt: skip
    executor([reader(), MinhashDedupFilter(input_folder=remove),
              JsonlWriter(str(work / "output"))], 1, "filter").run()  # fmt: skip
    kept = []
    for part in sorted((work / "output").glob("*.jsonl.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as f:
            kept += [json.loads(line)["id"] for line in f]
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--kept", type=Path, required=True)
    parser.add_argument("--words", choices=("kiwi", "whitespace", "split"), default="kiwi")
    args = parser.parse_args()
    kept = run(args.inputs, args.work, args.words)
    args.kept.write_text("".join(f"{k}\n" for k in kept), "utf-8")


if __name__ == "__main__":
    main()
