"""Milvus: galleries stored in a Milvus deployment (``engine``, ``storage``; what a collection
indexes in ``layouts``, its search in ``search``), and a collection of its owner's attached
read-only (``source``, ``attach``, ``attached``, ``texts``; an in-place migration's ``sibling``
collection). Imports only the shared core of ``app.vectors``; pymilvus loads with it."""
