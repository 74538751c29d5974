# A small file in the shapes SGLang's server_args.py uses, for
# scripts/gen-sglang-flags.py's test (TestGeneratorReadsBothLayouts). Not SGLang's code.
import argparse
import dataclasses
from typing import List, Literal, Optional

MODE_CHOICES = ["auto", "slow"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    mode: str = "auto"
    # The later, annotated layout.
    level: A[Literal[0, 1, 2, 3], "How much to log."] = 2
    sizes: A[Optional[List[int]], Arg(help="Batch sizes.")] = None
    fast: A[bool, "Go fast."] = False
    ratio: A[float, Arg(aliases=["--r"], help="A ratio.")] = 0.5
    hidden: A[int, Arg(no_cli=True)] = 3
    limit: A[str, Arg(type_parser=human_readable_int, cli_name="--max-limit")] = "1k"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size)
        parser.add_argument("--mode", type=str, choices=MODE_CHOICES, default=ServerArgs.mode)
        parser.add_argument("--labels", type=json.loads)
        parser.add_argument("--old-flag", action=DeprecatedAction)
        parser.add_argument("--thing", action=argparse.BooleanOptionalAction)
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")


def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)
