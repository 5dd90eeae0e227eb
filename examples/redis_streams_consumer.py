"""A Redis Streams consumer-group worker that drains on SIGTERM (lameduck.resume.consumer).

    python examples/redis_streams_consumer.py --redis redis://127.0.0.1:6379/0 \\
        --stream jobs --group workers --name worker-1 [--batch 10] [--work-ms 10] \\
        [--deadline 25]

"Processing" a message is a side effect in Redis, HINCRBY ``<stream>:processed`` on the
message's ``id`` field, then ``--work-ms`` of sleep: a message processed twice shows as a 2.
On SIGTERM (or SIGINT) it stops fetching, finishes the batch in hand while the deadline
allows, acks what it processed, leaves the rest pending for the other consumers (they claim
it after ``--min-idle-ms``), deletes itself from the group if nothing is pending in its name,
prints one JSON line (processed, acked, left_pending, cut, claimed, took_s) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import asdict

import redis.asyncio as aioredis

from lameduck.resume.consumer import ConsumerDrain, RedisStreamConsumer, StreamMessage


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    p.add_argument("--stream", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--name", required=True, help="consumer name, unique in the group")
    p.add_argument("--batch", type=int, default=10, help="XREADGROUP COUNT")
    p.add_argument("--work-ms", type=float, default=10.0, help="time each message takes")
    p.add_argument("--deadline", type=float, default=25.0,
                   help="seconds from SIGTERM to exit (under the platform's grace period)")
    p.add_argument("--margin", type=float, default=0.5,
                   help="seconds kept back at the end for ack, release and exit")
    p.add_argument("--item-budget-ms", type=float, default=None,
                   help="longest a message may take; default 2 x work-ms + 200")
    p.add_argument("--min-idle-ms", type=int, default=30_000,
                   help="XAUTOCLAIM min idle: the lease; the same for every consumer")
    p.add_argument("--claim-every", type=float, default=5.0,
                   help="seconds between XAUTOCLAIM scans for abandoned entries")
    p.add_argument("--block-ms", type=int, default=500,
                   help="XREADGROUP BLOCK: how long an idle fetch waits (well under deadline)")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> dict[str, object]:
    client = aioredis.Redis.from_url(args.redis, decode_responses=True)
    processed_key = f"{args.stream}:processed"
    work = args.work_ms / 1000
    budget_ms = args.item_budget_ms if args.item_budget_ms is not None else 2 * args.work_ms + 200

    async def process(msg: StreamMessage) -> None:
        await client.hincrby(processed_key, msg.fields.get("id", msg.id), 1)
        if work > 0:
            await asyncio.sleep(work)

    try:
        consumer = RedisStreamConsumer(
            client, args.stream, args.group, args.name, count=args.batch,
            block_ms=args.block_ms, min_idle_ms=args.min_idle_ms, claim_every=args.claim_every)
        await consumer.ensure_group()
        drain = ConsumerDrain(consumer.times(args.deadline, args.margin, budget_ms / 1000))
        logging.info("consuming %s as %s/%s", args.stream, args.group, args.name)
        summary = await consumer.run(process, drain)
        return {**asdict(summary), "claimed": consumer.claimed}
    finally:
        await client.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    result = asyncio.run(main(parse_args()))
    print(json.dumps(result), flush=True)
