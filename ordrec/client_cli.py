"""``ordrec-client``: query an ordrec server from the command line.

One subcommand per RPC, built on the Python client ``ordrec.client``. Before
the call it waits for the server to be ready (``--wait``), so it may be
started together with ``ordrec-serve``.

Exit codes: the gRPC status code of the call (0 OK, 3 INVALID_ARGUMENT,
5 NOT_FOUND, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, 16 UNAUTHENTICATED, ...,
the table in docs/service.md); ``health`` exits 0 only when SERVING and 14
otherwise; 2 for a malformed command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2

from ordrec.client import DEFAULT_TARGET, ENTITIES, Client
from ordrec.v1 import recommender_pb2 as pb

EXAMPLES = """\
examples:
  ordrec-client models
  ordrec-client recommend --model dcr --user u001 --n 5 --distribution
  ordrec-client recommend --model dcr --user u001 --n 5 --explain 2 --diversity 0.3
  ordrec-client similar --model dcr --item i001 --item i002 --n 5
  ordrec-client tags --model rtf --user u001 --item i001 --n 5
  ordrec-client neighbors --model coe --id i001 --from item --to user --k 5
  ordrec-client coordinates --model knnscal --limit 5 --json
  ordrec-client place --model knnscal --neighbor v001 --neighbor v002 --k 3
  ordrec-client record --user u001 --item i001 --item i002
  ordrec-client record --user u001 --rating i003=4 --rating i004=1.5
  ordrec-client --wait 0 health          (a probe: no waiting)

Load tests: ordrec-loadtest (see ordrec-loadtest --help).
"""

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]

# Connection options: (flags, keyword arguments, default). They are accepted
# before the subcommand and after it, so `ordrec-client recommend ... --json` works.
_CONNECTION: list[tuple[tuple[str, ...], dict[str, Any], Any]] = [
    (("--target",), dict(metavar="HOST:PORT", help="the server's address; $ORDREC_TARGET when set"), None),
    (
        ("--timeout",),
        dict(type=float, metavar="SECONDS", help="deadline of the call, retries included"),
        10.0,
    ),
    (
        ("--wait",),
        dict(
            type=float,
            metavar="SECONDS",
            help="wait this long for the server to be ready (health SERVING) before the call; 0: do not wait",
        ),
        30.0,
    ),
    (("--retries",), dict(type=int, metavar="N", help="tries again on UNAVAILABLE, with backoff"), 3),
    (
        ("--token",),
        dict(
            help="bearer token, when the server requires one; hide, unhide and forget need an admin"
            " token (prefer --token-env: a command line is visible to other users)"
        ),
        None,
    ),
    (("--token-env",), dict(metavar="VAR", help="environment variable holding the bearer token"), None),
    (
        ("--tls",),
        dict(action="store_true", help="connect with TLS, trusting the system's root certificates"),
        False,
    ),
    (
        ("--tls-ca",),
        dict(metavar="PEM", help="root certificate file to verify the server with (implies --tls)"),
        None,
    ),
    (
        ("--tls-server-name",),
        dict(
            metavar="NAME",
            help="name the server's certificate is checked against, when it differs from the target's host",
        ),
        None,
    ),
    (("--json",), dict(action="store_true", help="print the reply as JSON (protobuf field names)"), False),
]


# ------------------------------------------------------------------ output
def _to_dict(message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _print_scored(rows: Iterable[pb.ScoredId], indent: str = "  ") -> None:
    for rank, item in enumerate(rows, 1):
        extra = ""
        if item.rating_distribution:
            extra = "  P(r)=[" + ", ".join(f"{p:.2f}" for p in item.rating_distribution) + "]"
        name = f" ({item.label})" if item.label else ""
        new = "  [fresh: not yet trained on]" if item.fresh else ""
        source = f"  [{_SOURCE[item.fallback]}]" if item.fallback in _SOURCE else ""
        print(f"{indent}{rank:>3}. {item.id:<24} {item.score:+.4f}{name}{extra}{new}{source}")
        for why in item.explanations:
            rated = f" (rated {why.rating:g})" if why.HasField("rating") else ""
            print(f"{indent}       because of {why.id:<20} share {why.share:.2f}{rated}")


# Where a fallback answer's item came from (ScoredId.fallback).
_SOURCE = {pb.FALLBACK_TRENDING: "trending", pb.FALLBACK_POPULAR_GLOBAL: "popular"}


# ---------------------------------------------------------------- commands
def cmd_health(client: Client, args: argparse.Namespace) -> int:
    reply = client.health(args.service)
    if args.json:
        _print_json(_to_dict(reply))
    else:
        print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else _UNAVAILABLE


def cmd_models(client: Client, args: argparse.Namespace) -> int:
    reply = client.models()
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    for m in reply.models:
        sizes = ", ".join(f"{k}={v}" for k, v in sorted(m.sizes.items()))
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(m.metrics.items()))
        print(f"{m.name:<16} {m.kind:<8} {m.version}  ({m.reason})  rpcs={','.join(m.rpcs)}  {sizes}")
        if metrics:
            print(f"{'':<16} metrics: {metrics}")
    return 0


def cmd_recommend(client: Client, args: argparse.Namespace) -> int:
    reply = client.recommend(
        args.user,
        model=args.model,
        n=args.n,
        candidates=args.candidate or (),
        exclude_seen=False if args.include_seen else None,
        with_distribution=args.distribution,
        exclude=args.exclude or (),
        filter=args.filter,
        explain=args.explain,
        diversity=args.diversity,
        max_per_attribute=args.max_per_attribute,
    )
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    print(
        f"model {reply.model}@{reply.model_version}"
        + (f"  levels={list(reply.levels)}" if reply.levels else "")
    )
    if reply.seen_filter_degraded:
        print("(items recorded since training could not be excluded: Redis unreachable)")
    if reply.rules_stale:
        print("(hidden items may be out of date: Redis unreachable, the last known ones were applied)")
    for result in reply.results:
        note = (
            ""
            if result.fallback == pb.FALLBACK_NONE
            else f"  (fallback: {pb.Fallback.Name(result.fallback)})"
        )
        print(f"user {result.user_id}{note}")
        _print_scored(result.items)
    return 0


def cmd_similar(client: Client, args: argparse.Namespace) -> int:
    reply = client.similar(
        args.item,
        model=args.model,
        n=args.n,
        exclude=args.exclude or (),
        filter=args.filter,
        diversity=args.diversity,
        max_per_attribute=args.max_per_attribute,
    )
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    print(f"model {reply.model}@{reply.model_version}")
    if reply.unknown_item_ids:
        print(f"(not known to this version, ignored: {', '.join(reply.unknown_item_ids)})")
    if reply.rules_stale:
        print("(hidden items may be out of date: Redis unreachable, the last known ones were applied)")
    _print_scored(reply.items)
    return 0


def _attribute_cap(text: str) -> tuple[str, int]:
    """``--max-per-attribute NAME=M``."""
    name, sep, count = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=M (e.g. genre=2), got {text!r}") from None


def _diversity_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--diversity",
        type=float,
        default=0.0,
        metavar="LAMBDA",
        help="0 (the model's ranking) to 1: re-rank the top 5n by maximal marginal relevance",
    )
    parser.add_argument(
        "--max-per-attribute",
        type=_attribute_cap,
        metavar="NAME=M",
        help="at most M results per value of item attribute NAME, e.g. genre=2",
    )


def cmd_tags(client: Client, args: argparse.Namespace) -> int:
    reply = client.tags(args.user, args.item, model=args.model, n=args.n, exclude_own_tags=args.exclude_own)
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    print(f"model {reply.model}@{reply.model_version}  fallback={pb.Fallback.Name(reply.fallback)}")
    _print_scored(reply.tags)
    return 0


def cmd_neighbors(client: Client, args: argparse.Namespace) -> int:
    reply = client.neighbors(
        args.id,
        model=args.model,
        space=args.space,
        from_entity=args.from_entity,
        to_entity=args.to_entity,
        k=args.k,
    )
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    print(f"model {reply.model}@{reply.model_version}")
    _print_scored(reply.neighbors)
    return 0


def cmd_coordinates(client: Client, args: argparse.Namespace) -> int:
    points: list[pb.Point] = []
    head = None
    pages = client.coordinates(
        args.ids or (), model=args.model, space=args.space, entity_kind=args.entity, page_size=args.page_size
    )
    with contextlib.closing(pages):  # closing cancels the rest of the stream once --limit is reached
        for page in pages:
            if head is None:
                head = page
            points.extend(page.points)
            if args.limit and len(points) >= args.limit:
                break
    if args.limit:
        points = points[: args.limit]
    if args.json:
        _print_json(
            {
                "model": head.model if head else "",
                "model_version": head.model_version if head else "",
                "dim": head.dim if head else 0,
                "points": [_to_dict(p) for p in points],
            }
        )
        return 0
    for point in points:
        print(f"{point.id}\t" + "\t".join(f"{c:.5f}" for c in point.coords))
    return 0


def cmd_place(client: Client, args: argparse.Namespace) -> int:
    reply = client.place(args.neighbor, model=args.model, k=args.k)
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    print(f"model {reply.model}@{reply.model_version}")
    print("coords " + " ".join(f"{c:.5f}" for c in reply.coords))
    _print_scored(reply.neighbors)
    return 0


def _rating(text: str) -> tuple[str, float]:
    item, sep, value = text.rpartition("=")
    try:
        return (item, float(value)) if sep and item else _bad_rating(text)
    except ValueError:
        return _bad_rating(text)


def _bad_rating(text: str):
    raise argparse.ArgumentTypeError(f"{text!r} is not ITEM=VALUE (e.g. i001=4)")


def cmd_record(client: Client, args: argparse.Namespace) -> int:
    reply = client.record(args.user, args.item or (), ratings=dict(args.rating or ()), model=args.model)
    if args.json:
        _print_json(_to_dict(reply))
    else:
        print(f"recorded {reply.recorded} new item(s) for {args.user}")
    return 0


def cmd_hide(client: Client, args: argparse.Namespace) -> int:
    ids = list(args.item or ())
    if args.file:
        with open(args.file, encoding="utf-8") as lines:
            ids += [line.strip() for line in lines if line.strip()]
    change = client.hide if args.command == "hide" else client.unhide
    reply = change(ids, model=args.model)
    if args.json:
        _print_json(_to_dict(reply))
    else:
        scope = "all models" if reply.model == "*" else reply.model
        print(
            f"{args.command}: {reply.changed} of {len(ids)} item(s) changed for {scope};"
            f" {reply.total} hidden now"
            + (f"; {reply.unknown} unknown to the served version" if reply.unknown else "")
        )
    return 0


def cmd_forget(client: Client, args: argparse.Namespace) -> int:
    reply = client.forget(args.user, reason=args.reason)
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    again = " (already forgotten: finished what was left)" if reply.already_forgotten else ""
    print(f"forgot user digest={reply.user_digest}{again}")
    print(
        f"  redis: seen items {reply.seen_items}, ratings {reply.ratings}, online keys {reply.served_keys},"
        f" stream entries {reply.stream_entries}"
    )
    print(
        f"  registry: checkpoint events {reply.checkpoint_events}, versions removed {len(reply.versions_removed)}"
    )
    for version in reply.versions_pending:
        print(f"  pending until the next training run replaces it by a redacted copy: {version}")
    if reply.redis_rewrite:
        print(f"  redis files: {reply.redis_rewrite}")
    return 0


def cmd_hidden(client: Client, args: argparse.Namespace) -> int:
    reply = client.hidden(model=args.model, after_item_id=args.after)
    if args.json:
        _print_json(_to_dict(reply))
        return 0
    if reply.rules_stale:
        print("(may be out of date: Redis unreachable)")
    for scope in reply.scopes:
        print(f"{'all models' if scope.model == '*' else scope.model}: {scope.count} hidden")
        for item in scope.item_ids:
            print(f"  {item}")
    return 0


# ------------------------------------------------------------------ parser
class _Defaults(argparse.HelpFormatter):
    """Defaults shown after each help text that does not say its own."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "(default" in text
            or action.default in (None, "", False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


class _Formatter(_Defaults, argparse.RawDescriptionHelpFormatter):
    """The top-level help: its description and examples keep their line breaks."""


def _add_connection_options(parser: argparse.ArgumentParser, on_subcommand: bool) -> None:
    group = parser.add_argument_group("connection and output")
    for flags, kwargs, default in _CONNECTION:
        kwargs = dict(kwargs)
        if flags == ("--target",):
            default = os.environ.get("ORDREC_TARGET") or DEFAULT_TARGET
        if on_subcommand:
            # SUPPRESS: a value given before the subcommand is not overwritten by the default here.
            kwargs["default"] = argparse.SUPPRESS
            if default not in (None, False, ""):
                kwargs["help"] += f" (default: {default})"
        else:
            kwargs["default"] = default
        group.add_argument(*flags, **kwargs)


def _model_argument(parser: argparse.ArgumentParser, rpc: str) -> None:
    parser.add_argument(
        "--model",
        default="",
        help=f"registry name of the model; may be left out when exactly one loaded model answers {rpc}",
    )


def _subcommand(sub, name: str, func: Callable, help: str, description: str | None = None):
    p = sub.add_parser(
        name, help=help, description=description or help, formatter_class=_Defaults, allow_abbrev=False
    )
    p.set_defaults(func=func)
    _add_connection_options(p, on_subcommand=True)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``ordrec-client`` argument parser."""
    p = argparse.ArgumentParser(
        prog="ordrec-client",
        description=__doc__.split("\n\n", 1)[1].strip(),
        epilog=EXAMPLES,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    _add_connection_options(p, on_subcommand=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    h = _subcommand(
        sub,
        "health",
        cmd_health,
        "is the server SERVING (at least one model loaded)? exit 0 if so",
        "grpc.health.v1 Check. No token needed. Exit 0 when SERVING, 14 otherwise; use --wait 0 "
        "for a probe that answers at once.",
    )
    h.add_argument(
        "--service",
        default="",
        help="health service name: '' (the server), ordrec.v1.Recommender, or ordrec.redis",
    )

    _subcommand(
        sub, "models", cmd_models, "list the loaded models: version, why that version, RPCs, sizes, metrics"
    )

    r = _subcommand(
        sub,
        "recommend",
        cmd_recommend,
        "top-N items for one or more users (DCR, Pairwise DCR, COE)",
        "Top-N items per user. Training items (and items recorded since training) are left out; an "
        "unknown user gets the most popular items, flagged as a fallback.",
    )
    _model_argument(r, "Recommend")
    r.add_argument("--user", action="append", required=True, metavar="ID", help="user id; repeat for a batch")
    r.add_argument("--n", type=int, default=10, help="items per user")
    r.add_argument(
        "--candidate",
        action="append",
        metavar="ID",
        help="rank only these items; repeat for each (default: all items)",
    )
    r.add_argument("--include-seen", action="store_true", help="do not leave out the user's training items")
    r.add_argument("--distribution", action="store_true", help="DCR: show P(rating = level) for each item")
    r.add_argument("--exclude", action="append", metavar="ID", help="never return this item; repeat for each")
    r.add_argument(
        "--filter",
        default="",
        metavar="EXPR",
        help="only items whose attributes pass, e.g. 'genre in (\"Comedy\") and year >= 1990'",
    )
    r.add_argument(
        "--explain",
        type=int,
        default=0,
        metavar="K",
        help="show up to K items of the user's history that explain each result, with their shares",
    )
    _diversity_options(r)

    si = _subcommand(
        sub,
        "similar",
        cmd_similar,
        "items most similar to an item or a basket of items (DCR, Pairwise DCR, COE)",
        "The items nearest to one item, or to several (by the mean similarity), by the model's own "
        "item similarity; the query items, hidden items and --exclude never come back.",
    )
    _model_argument(si, "SimilarItems")
    si.add_argument(
        "--item", action="append", required=True, metavar="ID", help="item id; repeat for a basket"
    )
    si.add_argument("--n", type=int, default=10, help="items to return")
    si.add_argument(
        "--exclude", action="append", metavar="ID", help="never return this item; repeat for each"
    )
    si.add_argument("--filter", default="", metavar="EXPR", help="only items whose attributes pass")
    _diversity_options(si)

    t = _subcommand(sub, "tags", cmd_tags, "top-N tags for a user tagging an item (RTF)")
    _model_argument(t, "Tags")
    t.add_argument("--user", required=True, metavar="ID", help="the user doing the tagging")
    t.add_argument("--item", required=True, metavar="ID", help="the item being tagged")
    t.add_argument("--n", type=int, default=10, help="tags to return")
    t.add_argument(
        "--exclude-own",
        action="store_true",
        help="leave out tags this user already put on this item in the training data",
    )

    entities = sorted(ENTITIES)
    nb = _subcommand(
        sub,
        "neighbors",
        cmd_neighbors,
        "the k nearest entities on a map (COE, SCORE, KNNSCAL)",
        "The k nearest entities to --id. Scores are negative distances (higher is nearer).",
    )
    _model_argument(nb, "Neighbors")
    nb.add_argument("--id", required=True, help="the query entity's id")
    nb.add_argument(
        "--from",
        dest="from_entity",
        choices=entities,
        default=None,
        help="kind of the query entity (default: the model's, items for COE, objects for SCORE and KNNSCAL)",
    )
    nb.add_argument(
        "--to",
        dest="to_entity",
        choices=entities,
        default=None,
        help="kind of entity to return (default: the same as --from)",
    )
    nb.add_argument("--space", default="", help="SCORE: the aspect whose map to search")
    nb.add_argument("--k", type=int, default=10, help="neighbours to return")

    c = _subcommand(
        sub,
        "coordinates",
        cmd_coordinates,
        "map coordinates, for given ids or the whole map",
        "Map coordinates: one line per point (id, then coordinates), for --id or, without it, the "
        "whole map streamed in pages.",
    )
    _model_argument(c, "Coordinates")
    c.add_argument(
        "--id",
        dest="ids",
        action="append",
        metavar="ID",
        help="a point to look up; repeat for each (default: the whole map)",
    )
    c.add_argument(
        "--entity",
        choices=entities,
        default=None,
        help="kind of points (default: the model's, items for COE, objects for SCORE and KNNSCAL)",
    )
    c.add_argument("--space", default="", help="SCORE: the aspect's map")
    c.add_argument("--limit", type=int, default=0, help="stop after this many points (0: all)")
    c.add_argument(
        "--page-size", type=int, default=0, help="points per streamed message (0: the server's, 1000)"
    )

    pl = _subcommand(
        sub, "place", cmd_place, "place a new vertex on a KNNSCAL map from its ranked neighbours"
    )
    _model_argument(pl, "Place")
    pl.add_argument(
        "--neighbor",
        action="append",
        required=True,
        metavar="ID",
        help="a neighbour of the new vertex; repeat, nearest first",
    )
    pl.add_argument("--k", type=int, default=0, help="also return the new vertex's k nearest vertices")

    rec = _subcommand(
        sub,
        "record",
        cmd_record,
        "record items a user interacted with since training (needs Redis)",
        "RecordInteractions: Recommend leaves these items out for the user, and the next training"
        " job with [events] trains on them. Needs a server started with --redis"
        " (FAILED_PRECONDITION, exit 9, otherwise).",
    )
    rec.add_argument("--user", required=True, metavar="ID", help="the user")
    rec.add_argument("--item", action="append", metavar="ID", help="an item; repeat for each")
    rec.add_argument(
        "--rating",
        action="append",
        type=_rating,
        metavar="ITEM=VALUE",
        help="an item and its rating on the model's scale; repeat for each",
    )
    _model_argument(rec, "Recommend")

    for name, helptext in (
        ("hide", "hide items from Recommend and Neighbors, from the next request on"),
        ("unhide", "undo hide for the same scope"),
    ):
        hd = _subcommand(sub, name, cmd_hide, helptext)
        hd.add_argument("--model", default="*", help="a model name, or '*' for every model")
        hd.add_argument("--item", action="append", metavar="ID", help="an item; repeat for each")
        hd.add_argument("--file", help="item ids, one a line")
    fg = _subcommand(
        sub,
        "forget",
        cmd_forget,
        "erase a user everywhere (GDPR Art. 17); answered as unknown from now on",
        "ForgetUser: removes the user's recorded interactions (Redis, the events stream, the registry's"
        " events), the versions naming them that are no longer live, and keeps them out of every later"
        " answer and training. Safe to repeat.",
    )
    fg.add_argument("--user", required=True, metavar="ID", help="the user to erase")
    fg.add_argument(
        "--reason", default="", help="why, e.g. the request's ticket (logged, with the id's sha256)"
    )
    ls = _subcommand(sub, "hidden", cmd_hidden, "list hidden items by scope")
    ls.add_argument(
        "--model", default="", help="a model (its scope and the all-models one), '*', or '' (all)"
    )
    ls.add_argument("--after", default="", metavar="ID", help="the next page: ids sorting after this one")
    return p


def _token(args: argparse.Namespace) -> str | None:
    if args.token_env:
        value = os.environ.get(args.token_env, "").strip()
        if not value:
            raise ValueError(f"--token-env {args.token_env}: the variable is unset or empty")
        return value
    return args.token


def wait_for_server(client: Client, args: argparse.Namespace) -> None:
    """Wait up to ``--wait`` seconds for the server to be SERVING, saying so after the first second.

    When it is not ready in time the call is made anyway, so that its own
    status says why (UNAVAILABLE: connection refused, a TLS mismatch, ...).
    """
    quiet = min(args.wait, 1.0)
    if args.wait <= 0 or client.wait_ready(quiet) or args.wait <= quiet:
        return
    print(
        f"ordrec-client: waiting up to {args.wait:g} s for the server at {args.target} to be ready",
        file=sys.stderr,
        flush=True,
    )
    client.wait_ready(args.wait - quiet)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ordrec-client``; returns the exit code (the call's gRPC status code)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.wait < 0 or args.retries < 0:
        parser.error("--timeout must be positive, --wait and --retries at least 0")
    try:
        client = Client(
            args.target,
            token=_token(args),
            tls=args.tls,
            tls_ca=args.tls_ca,
            tls_server_name=args.tls_server_name,
            timeout=args.timeout,
            retries=args.retries,
        )
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    with client:
        try:
            wait_for_server(client, args)
            return args.func(client, args)
        except grpc.RpcError as exc:
            print(f"ordrec-client: {exc.code().name}: {exc.details()}{_hint(exc, args)}", file=sys.stderr)
            return exc.code().value[0]


def _hint(exc: grpc.RpcError, args: argparse.Namespace) -> str:
    """What to do about the commonest errors, appended to the server's message."""
    details = exc.details() or ""
    if "name one in 'model'" in details:
        return "  (name one with --model)"
    if exc.code() == grpc.StatusCode.UNAVAILABLE and "connect" in details.lower():
        return f"  (is ordrec-serve running at {args.target}? waited {args.wait:g} s: --wait)"
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
