"""``lu-client``: the service from the shell, with .npy/.npz files in and out.

    lu-client solve A.npy B.npy -o X.npy
    lu-client lu_factor A.npy -o factors.npz          # LU, pivots, info
    lu-client lu_solve factors.npz B.npy -o X.npy     # an .npz input supplies its named arrays
    lu-client lu_unpack factors.npz -o plu.npz --no-pivots
    lu-client factorization store A.npy --name sys1     # factor once, keep it on the server
    lu-client factorization solve sys1 B.npy -o X.npy  # send only B
    lu-client factorization delete sys1                 # also: list, show NAME
    lu-client solve_refined A.npy B.npy -o refined.npz --max-iter 10   # X, iterations, backward_error
    lu-client lu_rcond factors.npz anorm.npy -o rcond.npy --norm inf
    lu-client slogdet A.npy -o slogdet.npz
    lu-client det A.npy -o det.npy

The server is ``--url`` (or ``LU_URL``, default http://127.0.0.1:8000); the key is
``--api-key`` (or ``LU_API_KEY``); these and ``--json``, ``--timeout``, ``--retries``
and ``--progress`` go before or after the operation. Errors print the server's message
and request id and exit with status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lu_client._base import OPERATIONS
from lu_client._client import LUClient
from lu_client._errors import LUClientError

__all__ = ["main"]

FLAGS = {
    "pivot": ("--no-pivot", "factor without pivoting"),
    "left": ("--right", "solve X A = B instead of A X = B"),
    "adjoint": ("--adjoint", "solve with A^H"),
    "check_errors": ("--no-check-errors", "answer inf/NaN for singular systems instead of failing"),
    "unpack_data": ("--no-data", "do not return L and U"),
    "unpack_pivots": ("--no-pivots", "do not return P"),
}
DEFAULTS = {
    "lu_factor": {"pivot": True},
    "lu_unpack": {"unpack_data": True, "unpack_pivots": True},
    "lu_solve": {"left": True, "adjoint": False, "check_errors": True},
    "lu": {"pivot": True},
    "solve": {"left": True, "check_errors": True},
    "solve_refined": {"left": True},
    "lu_rcond": {},
    "slogdet": {},
    "det": {},
}
# Options that take a value: (operation, option) -> (flag, type, default, help).
VALUED: dict[tuple[str, str], tuple[str, Any, Any, str]] = {
    ("solve_refined", "factor_dtype"): (
        "--factor-dtype",
        str,
        None,
        "precision of the factorization (default float32/complex64 for double input; tf32, float16, "
        "bfloat16 on a GPU server)",
    ),
    ("solve_refined", "max_iter"): ("--max-iter", int, 30, "most refinement steps before falling back"),
    ("lu_rcond", "norm"): ("--norm", str, "1", "'1' or 'inf'"),
}


class _Progress:
    """A one-line progress bar on stderr for jobs split into several requests."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _connection_options(defaults: bool) -> argparse.ArgumentParser:
    """The options that apply to every operation, accepted before or after its name.

    The subcommands get them with ``SUPPRESS`` defaults, so an option given before the
    operation is not reset by the subcommand's parser.
    """
    common = argparse.ArgumentParser(add_help=False)

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    common.add_argument(
        "--url", default=default(os.environ.get("LU_URL", "http://127.0.0.1:8000")), help="service URL ($LU_URL)"
    )
    common.add_argument("--api-key", default=default(os.environ.get("LU_API_KEY")), help="bearer token ($LU_API_KEY)")
    common.add_argument(
        "--json", action="store_true", default=default(False), help="send JSON instead of the binary framing"
    )
    common.add_argument("--timeout", type=float, default=default(600.0), help="seconds per request (default 600)")
    common.add_argument(
        "--retries",
        type=int,
        default=default(2),
        help="retries on connection errors, 429, 502, 503 and 504 (default 2)",
    )
    common.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=default(None),
        help="progress bar (default: on a terminal)",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lu-client",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_connection_options(defaults=True)],
    )
    per_operation = _connection_options(defaults=False)
    ops = parser.add_subparsers(dest="op", required=True, metavar="operation")
    for op, (inputs, outputs) in OPERATIONS.items():
        sub = ops.add_parser(
            op,
            aliases=[op.replace("_", "-")],
            help=f"inputs {', '.join(inputs)} -> {', '.join(outputs)}",
            parents=[per_operation],
        )
        sub.add_argument(
            "files",
            nargs="+",
            type=Path,
            help=f".npy files for {', '.join(inputs)} in order, or .npz files holding them by name",
        )
        sub.add_argument("-o", "--output", type=Path, required=True, help=".npy (one output) or .npz (all outputs)")
        for option, default in DEFAULTS[op].items():
            flag, text = FLAGS[option]
            sub.add_argument(flag, dest=option, action="store_const", const=not default, default=default, help=text)
        for (owner, option), (flag, kind, default, text) in VALUED.items():
            if owner == op:
                sub.add_argument(flag, dest=option, type=kind, default=default, help=text)
        sub.set_defaults(canonical=op)
    _stored_parser(ops)
    return parser


def _stored_parser(ops: Any) -> None:
    group = ops.add_parser("factorization", help="factorizations stored on the server: store, solve, delete, ...")
    cmds = group.add_subparsers(dest="action", required=True, metavar="action")
    store = cmds.add_parser("store", help="factor A.npy on the server; prints its metadata (JSON)")
    store.add_argument("file", type=Path, help=".npy file holding A")
    store.add_argument("--name", help="name to store it under (default: a random one, printed)")
    store.add_argument("--no-pivot", dest="pivot", action="store_false", help=FLAGS["pivot"][1])
    solve = cmds.add_parser("solve", help="solve with a stored factorization: B.npy -> X.npy")
    solve.add_argument("name")
    solve.add_argument("file", type=Path, help=".npy file holding B")
    solve.add_argument("-o", "--output", type=Path, required=True, help=".npy file for X")
    for option, default in DEFAULTS["lu_solve"].items():
        flag, text = FLAGS[option]
        solve.add_argument(flag, dest=option, action="store_const", const=not default, default=default, help=text)
    delete = cmds.add_parser("delete", help="delete a stored factorization")
    delete.add_argument("name")
    show = cmds.add_parser("show", help="print a stored factorization's metadata (JSON)")
    show.add_argument("name")
    cmds.add_parser("list", help="print this API key's stored factorizations (JSON)")
    group.set_defaults(canonical="factorization")


def _stored(client: LUClient, args: argparse.Namespace) -> int:
    if args.action == "store":
        A = np.load(args.file, allow_pickle=False)
        print(json.dumps(client.factorize(A, name=args.name, pivot=args.pivot).metadata))
    elif args.action == "solve":
        B = np.load(args.file, allow_pickle=False)
        _writable(args.output)
        options = {k: getattr(args, k) for k in DEFAULTS["lu_solve"]}
        X = client.solve_factorization(args.name, B, **options)
        try:
            _save(args.output, {"X": X})
        except OSError as exc:  # after the request: not a usage error (exit 1, as for the operations)
            print(f"lu-client: cannot write the output: {exc}", file=sys.stderr)
            return 1
    elif args.action == "delete":
        client.delete_factorization(args.name)
    elif args.action == "show":
        print(json.dumps(client.factorization_metadata(args.name)))
    else:
        print(json.dumps(client.list_factorizations()))
    return 0


class _UsageError(Exception):
    """The command line names inputs that do not fit the operation (exit status 2)."""


def _load(files: list[Path], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    positional = iter(n for n in names)
    for path in files:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                arrays.update({k: npz[k] for k in npz.files if k in names})
        else:
            name = next((n for n in positional if n not in arrays), None)
            if name is None:
                raise _UsageError(f"too many input files (the inputs are {', '.join(names)})")
            arrays[name] = np.load(path, allow_pickle=False)
    missing = [n for n in names if n not in arrays]
    if missing:
        raise _UsageError(f"missing input {', '.join(missing)} (the inputs are {', '.join(names)})")
    return arrays


def _expected(op: str, options: dict[str, bool]) -> list[str]:
    outputs = list(OPERATIONS[op][1])
    if op == "lu_unpack":
        outputs = [
            o for o in outputs if (o == "P" and options["unpack_pivots"]) or (o != "P" and options["unpack_data"])
        ]
    return outputs


def _writable(path: Path) -> None:
    """Refuse (exit 2) an output path that could not be written, before any request is sent."""
    folder = path.parent if str(path.parent) else Path(".")
    if (
        path.is_dir()
        or not folder.is_dir()
        or not os.access(folder, os.W_OK)
        or (path.exists() and not os.access(path, os.W_OK))
    ):
        raise _UsageError(f"cannot write the output {str(path)!r}")


def _save(path: Path, outputs: dict[str, Any]) -> None:
    """The outputs at exactly ``path`` (NumPy would add .npy or .npz to another suffix)."""
    present = {k: v for k, v in outputs.items() if v is not None}
    with open(path, "wb") as f:
        if path.suffix == ".npz":
            np.savez(f, **present)
        else:
            np.save(f, next(iter(present.values())))


def _call(client: LUClient, op: str, a: dict[str, np.ndarray], options: dict[str, bool]) -> dict[str, Any]:
    if op == "lu_factor":
        return dict(zip(("LU", "pivots", "info"), client.lu_factor_ex(a["A"], **options), strict=True))
    if op == "lu_unpack":
        return dict(zip("PLU", client.lu_unpack(a["LU"], a["pivots"], **options), strict=True))
    if op == "lu_solve":
        return {"X": client.lu_solve(a["LU"], a["pivots"], a["B"], **options)}
    if op == "lu":
        return dict(zip("PLU", client.lu(a["A"], **options), strict=True))
    if op == "solve_refined":
        outputs = client.solve_refined(a["A"], a["B"], **options)
        return dict(zip(("X", "iterations", "backward_error"), outputs, strict=True))
    if op == "lu_rcond":
        return {"rcond": client.lu_rcond(a["LU"], a["pivots"], a["anorm"], **options)}
    if op == "slogdet":
        return dict(zip(("sign", "logabsdet"), client.slogdet(a["A"]), strict=True))
    if op == "det":
        return {"det": client.det(a["A"])}
    return {"X": client.solve(a["A"], a["B"], **options)}


def _client(args: argparse.Namespace, progress: _Progress | None = None) -> LUClient:
    return LUClient(
        args.url, api_key=args.api_key, timeout=args.timeout, max_retries=args.retries, binary=not args.json,
        on_progress=progress,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    op = args.canonical
    if op == "factorization":
        try:
            with _client(args) as client:
                return _stored(client, args)
        except _UsageError as exc:
            print(f"lu-client: {exc}", file=sys.stderr)
            return 2
        except (OSError, ValueError, TypeError) as exc:  # an unreadable file, a bad name, option or array
            print(f"lu-client: bad input: {exc}", file=sys.stderr)
            return 2
        except LUClientError as exc:
            print(f"lu-client: {exc}", file=sys.stderr)
            return 1
    inputs, outputs = OPERATIONS[op]
    try:
        arrays = _load(args.files, inputs)
    except _UsageError as exc:
        print(f"lu-client: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"lu-client: cannot read input: {exc}", file=sys.stderr)
        return 2
    options = {k: getattr(args, k) for k in DEFAULTS[op]}
    options.update({option: getattr(args, option) for owner, option in VALUED if owner == op})
    expected = _expected(op, options)
    if args.output.suffix != ".npz" and len(expected) != 1:
        print(f"lu-client: {op} returns {', '.join(expected)}: write them to an .npz file", file=sys.stderr)
        return 2
    progress = _Progress(sys.stderr.isatty() if args.progress is None else args.progress)
    try:
        _writable(args.output)
        with _client(args, progress) as client:
            result = _call(client, op, arrays, options)
    except _UsageError as exc:
        print(f"lu-client: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:  # an option or an array the client refuses before sending
        print(f"lu-client: bad input: {exc}", file=sys.stderr)
        return 2
    except LUClientError as exc:
        print(f"lu-client: {exc}", file=sys.stderr)
        return 1
    try:
        _save(args.output, {k: result.get(k) for k in outputs})
    except OSError as exc:
        print(f"lu-client: cannot write the output: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
