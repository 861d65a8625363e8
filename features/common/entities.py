"""Feast entities of the CTR domain shared by the cross-statistics views: the user and the
item.

Their join keys are the id columns of the impression log (``user_id``, ``item_id``); the other
keys of the pair views (item category, user segment, context, position) are defined beside those
views in ``ctr/cross_views.py``.
"""

from feast import Entity, ValueType

user = Entity(
    name="user",
    join_keys=["user_id"],
    value_type=ValueType.INT64,
    description="A user (int64 user_id).",
)

item = Entity(
    name="item",
    join_keys=["item_id"],
    value_type=ValueType.INT64,
    description="An item (int64 item_id).",
)
