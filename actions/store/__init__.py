"""Object store: the only place where campaign bytes live.

Every action and flow reads and writes through an :class:`ObjectStore`; nothing else in the
code base talks to a filesystem path or an S3 SDK for campaign data. The package, bottom up
(each module imports only those above it in this list):

* :mod:`.protocol` -- the :class:`ObjectStore` contract, the errors, how blob bytes are passed;
* :mod:`.local` -- :class:`LocalStore`, a directory on local disk (the embedded default);
* :mod:`.s3` -- ``S3Store``, any S3 endpoint (MinIO, AWS S3, SeaweedFS, Ceph RGW), with
  :mod:`.s3_settings` (URI and environment), :mod:`.s3_errors` (one-line errors, no secrets),
  :mod:`.s3_reads` (ranged parallel reads) and :mod:`.s3_fastpath` (what it takes from
  botocore internals, and the fallback when they change). Imported only for an ``s3://`` URI;
* :mod:`.pool` -- the bounded thread pool for the blobs of one artifact;
* :mod:`.objects` -- JSON objects and compare-and-swap on any backend;
* :mod:`.artifacts` -- content-addressed blobs plus a manifest written last;
* :mod:`.commits` -- the commit pointer: create-once step records read without listing;
* :mod:`.uri` -- :func:`open_store`, the backend a URI names.

Beside the client, modules that say what the campaign keeps in the store and how names read
from it are checked (each imports the client, never the reverse, so importing the package loads
no torch):

* :mod:`.safe_paths` -- names that come from the store are data: checked before use;
* :mod:`.credentials` and :mod:`.endpoints` -- where the S3 (and OpenWhisk) secrets and
  endpoints come from, and redaction;
* :mod:`.weights` -- policy versions (one blob per tensor) and ``weights_sha256``;
* :mod:`.optim_state` -- AdamW state as flat tensors, stored like weights;
* :mod:`.drafts` -- earlier epochs' responses kept for speculative decoding;
* :mod:`.profile_cache` -- the measured engine profile and its cache under ``profiles/``.

Callers import from this package; the names below are its public interface. What it does not
cover: garbage collection (``flows/campaign/collect.py``) and the run lease (``flows/campaign/lease.py``), which are
built on it.
"""

from actions.store.artifacts import (
                                            BLOB_PREFIX,
                                            PutStats,
                                            blob_key,
                                            get_artifact,
                                            get_blob,
                                            put_artifact,
                                            put_blob,
                                            read_manifest,
                                            sha256_hex,
)
from actions.store.commits import commit_key, commit_pointer, read_pointer
from actions.store.local import LocalStore
from actions.store.objects import delete_if, get_json, put_json, replace_if
from actions.store.pool import map_bounded, transfer_threads
from actions.store.protocol import (
                                            BlobData,
                                            BucketNotFound,
                                            CommitConflict,
                                            IntegrityError,
                                            ObjectNotFound,
                                            ObjectStore,
                                            StoreAccessDenied,
                                            StoreCredentialsError,
                                            StoreError,
                                            StoreUnreachable,
                                            as_parts,
)
from actions.store.uri import open_store

__all__ = [
    "BLOB_PREFIX", "BlobData", "BucketNotFound", "CommitConflict", "IntegrityError", "LocalStore", "ObjectNotFound",
    "ObjectStore", "PutStats", "StoreAccessDenied", "StoreCredentialsError", "StoreError", "StoreUnreachable",
    "as_parts", "blob_key", "commit_key", "commit_pointer", "delete_if", "get_artifact", "get_blob", "get_json",
    "map_bounded", "open_store", "put_artifact", "put_blob", "put_json", "read_manifest", "read_pointer",
    "replace_if", "sha256_hex", "transfer_threads",
]
