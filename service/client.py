"""``ordrec-client``: a small command-line client for the ordrec gRPC API.

Examples::

    ordrec-client --target 127.0.0.1:50051 models
    ordrec-client recommend --model dcr --user u001 --n 5 --distribution
    ordrec-client tags --model rtf --user 2 --item 51 --n 5
    ordrec-client neighbors --model coe --id i001 --from item --to user --k 5
    ordrec-client coordinates --model knnscal --limit 5
    ordrec-client health
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

_ENTITIES = {"": pb.ENTITY_UNSPECIFIED, "item": pb.ENTITY_ITEM, "user": pb.ENTITY_USER,
             "aspect": pb.ENTITY_ASPECT, "object": pb.ENTITY_ITEM}


def _print_scored(rows, indent: str = "  ") -> None:
    for rank, item in enumerate(rows, 1):
        extra = ""
        if item.rating_distribution:
            extra = "  P(r)=[" + ", ".join(f"{p:.2f}" for p in item.rating_distribution) + "]"
        name = f" ({item.label})" if item.label else ""
        print(f"{indent}{rank:>3}. {item.id:<24} {item.score:+.4f}{name}{extra}")


def _metadata(args) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {args.token}")] if args.token else []


def run(args: argparse.Namespace) -> int:
    with grpc.insecure_channel(args.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        md, timeout = _metadata(args), args.timeout
        if args.command == "health":
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout)
            print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
        elif args.command == "models":
            for m in stub.ListModels(pb.ListModelsRequest(), timeout=timeout, metadata=md).models:
                sizes = ", ".join(f"{k}={v}" for k, v in sorted(m.sizes.items()))
                print(f"{m.name:<16} {m.kind:<8} {m.version}  ({m.reason})  rpcs={','.join(m.rpcs)}  {sizes}")
        elif args.command == "recommend":
            req = pb.RecommendRequest(model=args.model, user_ids=args.user, n=args.n,
                                      with_distribution=args.distribution,
                                      candidate_item_ids=args.candidates or [])
            if args.include_seen:
                req.exclude_seen = False
            reply = stub.Recommend(req, timeout=timeout, metadata=md)
            print(f"model {reply.model}@{reply.model_version}"
                  + (f"  levels={list(reply.levels)}" if reply.levels else ""))
            for result in reply.results:
                note = "" if result.fallback == pb.FALLBACK_NONE else f"  (fallback: {pb.Fallback.Name(result.fallback)})"
                print(f"user {result.user_id}{note}")
                _print_scored(result.items)
        elif args.command == "tags":
            reply = stub.Tags(pb.TagsRequest(model=args.model, user_id=args.user, item_id=args.item, n=args.n,
                                             exclude_own_tags=args.exclude_own), timeout=timeout, metadata=md)
            print(f"model {reply.model}@{reply.model_version}  fallback={pb.Fallback.Name(reply.fallback)}")
            _print_scored(reply.tags)
        elif args.command == "neighbors":
            reply = stub.Neighbors(pb.NeighborsRequest(
                model=args.model, space=args.space, id=args.id, k=args.k,
                from_entity=_ENTITIES[args.from_entity], to_entity=_ENTITIES[args.to_entity]),
                timeout=timeout, metadata=md)
            print(f"model {reply.model}@{reply.model_version}")
            _print_scored(reply.neighbors)
        elif args.command == "coordinates":
            shown = 0
            for page in stub.Coordinates(pb.CoordinatesRequest(
                    model=args.model, space=args.space, entity=_ENTITIES[args.entity], ids=args.ids or []),
                    timeout=timeout, metadata=md):
                for point in page.points:
                    if args.limit and shown >= args.limit:
                        return 0
                    print(f"{point.id}\t" + "\t".join(f"{c:.5f}" for c in point.coords))
                    shown += 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ordrec-client", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--token", help="bearer token, when the server requires one")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("health")
    sub.add_parser("models")
    r = sub.add_parser("recommend")
    r.add_argument("--model", default="")
    r.add_argument("--user", action="append", required=True, help="repeat for a batch")
    r.add_argument("--n", type=int, default=10)
    r.add_argument("--candidates", nargs="*")
    r.add_argument("--include-seen", action="store_true")
    r.add_argument("--distribution", action="store_true")
    t = sub.add_parser("tags")
    t.add_argument("--model", default="")
    t.add_argument("--user", required=True)
    t.add_argument("--item", required=True)
    t.add_argument("--n", type=int, default=10)
    t.add_argument("--exclude-own", action="store_true")
    nb = sub.add_parser("neighbors")
    nb.add_argument("--model", default="")
    nb.add_argument("--space", default="")
    nb.add_argument("--id", required=True)
    nb.add_argument("--from", dest="from_entity", choices=sorted(_ENTITIES), default="")
    nb.add_argument("--to", dest="to_entity", choices=sorted(_ENTITIES), default="")
    nb.add_argument("--k", type=int, default=10)
    c = sub.add_parser("coordinates")
    c.add_argument("--model", default="")
    c.add_argument("--space", default="")
    c.add_argument("--entity", choices=sorted(_ENTITIES), default="")
    c.add_argument("--ids", nargs="*")
    c.add_argument("--limit", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except grpc.RpcError as exc:
        print(f"ordrec-client: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
