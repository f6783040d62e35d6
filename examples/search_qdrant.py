"""Top-k point ids of your Qdrant collection of OLD vectors for NEW backbone query features."""

from onnx_query import query_vectors
from qdrant_client import QdrantClient, models


def search_qdrant(
    model_zip: str, features, client: QdrantClient, collection: str, vector=None, k: int = 10
) -> list[list]:
    params = client.get_collection(collection).config.params.vectors
    if (params[vector] if vector else params).distance != models.Distance.COSINE:
        raise ValueError(f"{collection} is not a cosine collection")
    requests = [
        models.QueryRequest(query=q.tolist(), using=vector, limit=k)
        for q in query_vectors(model_zip, features)
    ]
    answers = client.query_batch_points(collection, requests=requests)
    return [[point.id for point in answer.points] for answer in answers]
