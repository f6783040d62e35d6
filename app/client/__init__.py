"""The nobackfill Python client: ``Client(url, key)``; numpy in, numpy arrays and dicts out.

from app.client import Client
with Client() as nb:  # $NOBACKFILL_URL, $NOBACKFILL_KEY
    gallery = nb.create_gallery("products", dim=384, model_name="old", metric="cosine")
    nb.upload_vectors(gallery["id"], ids, vectors)
"""

from app.client.client import Client
from app.client.errors import ApiError, UploadInterrupted
from app.client.results import SearchResults
from app.client.transport import NoServerError
from app.client.uploads import InputError

__all__ = [
    "ApiError",
    "Client",
    "InputError",
    "NoServerError",
    "SearchResults",
    "UploadInterrupted",
]
