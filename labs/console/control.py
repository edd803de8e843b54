"""Who holds an attempt's keyboard while course staff have taken control: one Redis key per attempt (this
process's memory without Redis), kept alive by the staff member's consumer and gone when they release it, leave,
or their process dies (it expires)."""

from __future__ import annotations

import json

from labs.console.redis_client import console_key, shared_redis

_local: dict[int, dict] = {}


async def control_holder(*, attempt_id: int) -> dict | None:
    """``{"by": channel, "who": name}`` of the staff member holding the keyboard, or None."""
    client = shared_redis()
    if client is None:
        return _local.get(attempt_id)
    raw = await client.get(console_key("control", attempt_id))
    try:
        holder = json.loads(raw) if raw else None
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


async def control_take(*, attempt_id: int, by: str, who: str, ttl: float) -> None:
    """Take (or renew) the keyboard; a colleague who held it loses it."""
    holder = {"by": by, "who": who}
    client = shared_redis()
    if client is None:
        _local[attempt_id] = holder
        return
    await client.set(console_key("control", attempt_id), json.dumps(holder), px=int(ttl * 1000))


async def control_release(*, attempt_id: int, by: str) -> bool:
    """Hand the keyboard back if ``by`` holds it; True if it did."""
    holder = await control_holder(attempt_id=attempt_id)
    if holder is None or holder.get("by") != by:
        return False
    client = shared_redis()
    if client is None:
        _local.pop(attempt_id, None)
    else:
        await client.delete(console_key("control", attempt_id))
    return True
