"""``store.uri`` as ``check_store_uri`` reads it (the campaign's and ``--store``'s)."""

from __future__ import annotations

import pytest


def test_a_file_store_may_have_an_at_sign_in_its_path_not_a_password_in_its_authority():
    from flows.config import check_store_uri

    assert check_store_uri("file:///data/runs@v2") == "file:///data/runs@v2"
    assert check_store_uri("file://localhost/data/runs@v2") == "file://localhost/data/runs@v2"
    for uri in ("file://key:Secret42@minio/bucket", "file://AKIA:wJal/Secret42@minio:9000/bucket",
                "file://AKIA:p?Secret42@minio/b", "file://AKIA:p#Secret42@minio/b"):
        with pytest.raises(ValueError, match=r"^store.uri carries a user name or password \(user:password@\) in a "
                                             r"file:// URI") as info:
            check_store_uri(uri)
        assert "Secret42" not in str(info.value)
