"""Feast entities of the CTR domain: the user, the item, and the item's primary genre.

Their join keys are the key columns of ``cascade.ctr_schema``; the user x genre view joins on
two of them (``user_id`` and ``genre``).
"""

from feast import Entity, ValueType

user = Entity(
    name="user",
    join_keys=["user_id"],
    value_type=ValueType.INT64,
    description="A MovieLens user (int64 user_id).",
)

item = Entity(
    name="item",
    join_keys=["item_id"],
    value_type=ValueType.INT64,
    description="A MovieLens item (int64 item_id).",
)

genre = Entity(
    name="genre",
    join_keys=["genre"],
    value_type=ValueType.STRING,
    description="An item's primary genre; with user it keys the user x genre view.",
)
