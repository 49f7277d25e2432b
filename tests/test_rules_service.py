"""Business rules end to end: hidden items (Redis and registry), exclusions and filters,
against real server processes, a real redis-server and the real CLIs."""

from __future__ import annotations

import time
import zlib

import grpc
import pytest

from ordrec.client import Client
from ordrec.tools.process import ServerProcess, run_cli, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.admin_token import ADMIN_ENV, ADMIN_FLAGS, ADMIN_METADATA, ADMIN_TOKEN
from tests.conftest import train_into
from tests.scrape import metric

GENRES = ["Action", "Comedy", "Drama", "Horror"]


def genre_of(item: str) -> str:
    return GENRES[zlib.crc32(item.encode()) % len(GENRES)]


@pytest.fixture(scope="module")
def rules_registry(sample_dir, tmp_path_factory):
    """dcr with item attributes (a csv) and coe, trained through the real CLI; private to these tests,
    since hiding writes into the registry."""
    items = [line.split("|")[0] for line in (sample_dir / "items.txt").read_text().splitlines() if line]
    csv = tmp_path_factory.mktemp("meta") / "items.csv"
    csv.write_text(
        "item,genre,year,price\n"
        + "".join(
            f"{i},{genre_of(i)}|Family,{1950 + k % 70},{5 + k % 30}\n"
            if k % 2
            else f"{i},{genre_of(i)},{1950 + k % 70},{5 + k % 30}\n"
            for k, i in enumerate(items)
        )
    )
    registry = tmp_path_factory.mktemp("rules-registry")
    return train_into(
        registry,
        sample_dir,
        [
            ("dcr", "dcr", "ratings.data", ["--set", "max_iter=5", "--item-attributes", str(csv)]),
            ("coe", "coe", "ratings.data", ["--set", "max_iter=3"]),
        ],
    )


def stub_of(channel):
    return recommender_pb2_grpc.RecommenderStub(channel)


AS_ADMIN = {"timeout": 5, "metadata": ADMIN_METADATA}  # HideItems and UnhideItems are admin calls


def recommended(stub, user="u001", n=10, model="dcr", **kw) -> list[str]:
    reply = stub.Recommend(pb.RecommendRequest(model=model, user_ids=[user], n=n, **kw), timeout=5)
    return [i.id for i in reply.results[0].items]


def neighbours(stub, item: str, k=20) -> list[str]:
    reply = stub.Neighbors(pb.NeighborsRequest(model="coe", id=item, k=k), timeout=5)
    return [i.id for i in reply.neighbors]


# ------------------------------------------------------------ filters, exclusions
def test_filters_and_exclusions(rules_registry):
    with (
        ServerProcess(rules_registry, "--poll-interval", "0") as proc,
        grpc.insecure_channel(proc.target) as ch,
    ):
        stub = stub_of(ch)
        comedies = recommended(stub, n=15, filter='genre in ("Comedy", "Horror") and year >= 1960')
        assert len(comedies) == 15 and all(genre_of(i) in ("Comedy", "Horror") for i in comedies)
        # multi-valued: every odd item is also "Family"
        family = recommended(stub, n=5, filter='genre = "Family" and price between 10 and 20')
        assert len(family) == 5
        plain = recommended(stub, n=10)
        assert recommended(stub, n=8, exclude_item_ids=plain[:2] + ["not-an-item"]) == plain[2:10]
        # an unknown user's popular fallback obeys the rules too
        assert all(
            genre_of(i) == "Drama" for i in recommended(stub, user="newcomer", filter='genre = "Drama"')
        )
        with pytest.raises(grpc.RpcError) as err:
            recommended(stub, filter='year >= 1990 and genre in ("Comedy" "Drama")')
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            "filter clause 2" in err.value.details() and 'genre in ("Comedy" "Drama")' in err.value.details()
        )
        with pytest.raises(grpc.RpcError) as err:
            recommended(stub, filter='colour = "red"')
        assert (
            err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "no item attribute 'colour'" in err.value.details()
        )


# --------------------------------------------------------------- without Redis
def test_hidden_items_without_redis_follow_the_registry_poll(rules_registry):
    with (
        ServerProcess(rules_registry, "--poll-interval", "0.3", *ADMIN_FLAGS) as a,
        ServerProcess(rules_registry, "--poll-interval", "0.3", *ADMIN_FLAGS) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        sa, sb = stub_of(ca), stub_of(cb)
        top = recommended(sa)
        reply = sa.HideItems(pb.HideItemsRequest(model="dcr", item_ids=top[:3] + ["future-item"]), **AS_ADMIN)
        assert (reply.changed, reply.unknown, reply.total) == (4, 1, 4)
        assert not set(top[:3]) & set(recommended(sa))  # the very next request on this replica
        wait_for(lambda: not set(top[:3]) & set(recommended(sb)), 3, what="replica b applies the hide")
        assert (rules_registry / "dcr" / "HIDDEN").read_text().split() == sorted(top[:3] + ["future-item"])
        # the all-models scope, written by the trainer's CLI, reaches Neighbors and Recommend
        near = neighbours(sa, "i189")
        run_cli(["ordrec.trainer", "registry", "hide", "--registry", str(rules_registry), near[0]])
        for stub in (sa, sb):
            wait_for(
                lambda stub=stub: (
                    near[0] not in neighbours(stub, "i189") and near[0] not in recommended(stub, n=200)
                ),
                3,
                what="an all-models hide reaches Neighbors and Recommend",
            )
        assert neighbours(sa, "i189", k=19) == near[1:]
        listed = {s.model: s.count for s in sa.ListHidden(pb.ListHiddenRequest(), timeout=5).scopes}
        assert listed == {"*": 1, "dcr": 4}
        sa.UnhideItems(pb.HideItemsRequest(model="dcr", item_ids=top[:3]), **AS_ADMIN)
        run_cli(["ordrec.trainer", "registry", "unhide", "--registry", str(rules_registry), near[0]])
        wait_for(lambda: recommended(sb) == top, 3, what="unhide")
        sa.UnhideItems(pb.HideItemsRequest(model="dcr", item_ids=["future-item"]), **AS_ADMIN)
        for bad, code in (
            (pb.HideItemsRequest(model="dcr"), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.HideItemsRequest(model="Bad Name", item_ids=["x"]), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.HideItemsRequest(model="absent", item_ids=["x"]), grpc.StatusCode.NOT_FOUND),
            (pb.HideItemsRequest(model="*", item_ids=["x" * 300]), grpc.StatusCode.INVALID_ARGUMENT),
            # one a line in HIDDEN: this would hide "a" and "b"
            (pb.HideItemsRequest(model="*", item_ids=["i001", "a\nb"]), grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.RpcError) as err:
                sa.HideItems(bad, **AS_ADMIN)
            assert err.value.code() == code, bad
        assert not (rules_registry / "HIDDEN").read_text().strip()
        cli = run_cli(
            ["ordrec.trainer", "registry", "hide", "--registry", str(rules_registry), "a\tb"], check=False
        )
        assert cli.returncode != 0 and "control character" in cli.stderr
        assert not (rules_registry / "HIDDEN").read_text().strip()


# ------------------------------------------------------------------ with Redis
def test_hidden_items_with_redis(rules_registry, redis_server):
    args = (*redis_server.serve_flags, "--poll-interval", "0", *ADMIN_FLAGS)
    with (
        ServerProcess(rules_registry, *args) as a,
        ServerProcess(rules_registry, *args) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        sa, sb = stub_of(ca), stub_of(cb)
        top = recommended(sb)
        # the Python client
        with Client(a.target, timeout=5, token=ADMIN_TOKEN) as client:
            assert client.hide([top[5]], model="dcr").changed == 1
            assert [s.count for s in client.hidden(model="dcr").scopes] == [0, 1]
            assert client.unhide([top[5]], model="dcr").total == 0
        # hide through the client CLI on replica a; replica b converges within a second
        result = run_cli(
            [
                "ordrec.client_cli",
                "--target",
                a.target,
                "--token-env",
                ADMIN_ENV,
                "hide",
                "--item",
                top[0],
                "--item",
                top[1],
            ]
        )
        assert "2 of 2 item(s) changed for all models" in result.stdout
        start = time.monotonic()
        wait_for(
            lambda: not {top[0], top[1]} & set(recommended(sb)),
            1.0,
            interval=0.02,
            what="replica b applies a hide within a second",
        )
        converged = time.monotonic() - start
        assert converged < 1.0
        print(f"replica b applied the hide after {converged:.3f} s")
        reply = sb.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=5)
        assert not reply.rules_stale
        # Redis goes down: the hidden items stay hidden, the replies say the state may be stale
        redis_server.stop()
        wait_for(
            lambda: (
                sb.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=5).rules_stale
            ),
            3,
            what="rules_stale",
        )
        for stub in (sa, sb):
            assert not {top[0], top[1]} & set(recommended(stub, n=100))
        assert metric(b, "ordrec_rules_stale") == 1 and metric(b, "ordrec_hidden_items") == 2
        with pytest.raises(grpc.RpcError) as err:
            sa.HideItems(pb.HideItemsRequest(model="*", item_ids=[top[2]]), **AS_ADMIN)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # a replica starting while Redis is down reads the registry copy, not an empty set
        with ServerProcess(rules_registry, *args) as c, grpc.insecure_channel(c.target) as cc:
            reply = stub_of(cc).Recommend(
                pb.RecommendRequest(model="dcr", user_ids=["u001"], n=100), timeout=5
            )
            assert reply.rules_stale and not {top[0], top[1]} & {i.id for i in reply.results[0].items}
        redis_server.start()
        wait_for(
            lambda: (
                not sb.Recommend(
                    pb.RecommendRequest(model="dcr", user_ids=["u001"], n=10), timeout=5
                ).rules_stale
            ),
            5,
            what="fresh again",
        )


def test_list_hidden_pages_through_a_long_list(tmp_path):
    """Each scope's reply holds at most --max-ids ids; ``after_item_id`` asks for the next page."""
    registry = tmp_path / "registry"
    registry.mkdir()
    ids = [f"item{i:02d}" for i in range(10)]
    with (
        ServerProcess(registry, "--max-ids", "4", *ADMIN_FLAGS) as server,
        Client(server.target, timeout=5, token=ADMIN_TOKEN) as client,
    ):
        for start in range(0, 10, 4):
            client.hide(ids[start : start + 4])
        pages, after = [], ""
        while True:
            (scope,) = client.hidden(model="*", after_item_id=after).scopes
            assert scope.count == 10
            if not scope.item_ids:
                break
            pages.append(list(scope.item_ids))
            after = scope.item_ids[-1]
        assert pages == [ids[0:4], ids[4:8], ids[8:10]]
