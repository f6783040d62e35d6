"""Top-k primary keys of your Milvus collection of OLD vectors for NEW backbone query features."""

from onnx_query import query_vectors
from pymilvus import MilvusClient


def search_milvus(
    model_zip: str, features, client: MilvusClient, collection: str, field: str, k: int = 10
) -> list[list]:
    for index in client.list_indexes(collection, field_name=field):
        if client.describe_index(collection, index)["metric_type"] != "COSINE":
            raise ValueError(f"{collection}.{field} is not indexed for cosine")
    results = client.search(
        collection,
        data=query_vectors(model_zip, features).tolist(),
        anns_field=field,
        limit=k,
        search_params={"metric_type": "COSINE"},
    )
    return [[hit["id"] for hit in hits] for hits in results]
