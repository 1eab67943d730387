"""A local ECR: moto's ECR control plane with the images in a real registry (:mod:`lmforge.local.registry`).

A client does exactly what it does with real ECR: ``CreateRepository``, ``GetAuthorizationToken``,
``docker login``/``podman login`` to the returned ``proxyEndpoint``, push ``HOST:PORT/REPO:TAG`` (the
endpoint's host), then ``DescribeImages`` & co. Here ``proxyEndpoint`` is the local registry
(``http://127.0.0.1:PORT``), so the push lands in it, and the image calls read what is really there.

What :func:`install` changes in moto's ECR (moto 5.2; everything else is moto's own behaviour):

- ``GetAuthorizationToken``: ``authorizationToken`` is base64 of ``AWS:<random token>``,
  ``proxyEndpoint`` the local registry's URL, ``expiresAt`` 12 hours ahead. The registry has no auth
  and accepts any credentials. Without a running registry the call fails with ``ServerException``
  saying why.
- ``DescribeImages``, ``ListImages``, ``BatchGetImage``, ``BatchDeleteImage`` answer from the
  registry (registry repository name == ECR repository name) for repositories that exist in moto:
  every manifest in the repository, tagged or not (an index's platform manifests count as untagged
  images, as in ECR), with ``imageSizeInBytes`` (layers + config; an index: its largest manifest),
  ``imagePushedAt`` (the time the registry stored the manifest in that repository),
  ``imageManifestMediaType`` and ``artifactMediaType``. ``filter.tagStatus``, ``maxResults`` and
  ``nextToken`` work (100 results a page by default, as in ECR). A missing image is
  ``ImageNotFoundException`` (DescribeImages) or a ``failures`` entry (the batch calls). Deleting by
  tag removes only that tag when the image has others.
- ``PutImage`` stores the manifest in the registry (so ``BatchGetImage`` + ``PutImage`` retags an
  image, as with ECR); a manifest whose blobs are not in the repository is ``LayersNotFoundException``.
- ``DeleteRepository`` counts the registry's images (``RepositoryNotEmptyException`` without
  ``force``); with ``force`` it deletes them and drops the repository from the registry.

:func:`parse_ecr_uri` splits an ECR image URI; :func:`resolve` maps one of the local account to the
name to pull from the local registry. :func:`restore_repositories` re-creates, after a restart, the
repositories an earlier run created.

Modules: :mod:`.uris` (image URIs), :mod:`.patches` (:func:`install`), :mod:`.backend` and
:mod:`.responses` (the patched calls), :mod:`.images` (the registry's images, pagination),
:mod:`.store` (repository persistence), :mod:`.errors` (the registry served from, ECR errors).

Limitations: one registry serves every region and account, by repository name (the same name in two
regions shares images; :func:`resolve` ignores the region). The registry accepts pushes to any name,
including repositories that do not exist in moto (ECR refuses them), and does not enforce tag
immutability or lifecycle policies. moto's repositories live in memory while the registry's storage
persists, so a repository created again after a restart shows the images still stored under its name.
The layer-upload calls (``InitiateLayerUpload`` & co.) and image scans stay moto's in-memory
emulation. ``BatchGetImage`` ignores ``acceptedMediaTypes`` (no manifest conversion).
"""

from lmforge.local.ecr.images import DEFAULT_PAGE, MAX_PAGE, RegistryImage
from lmforge.local.ecr.patches import check_compatible, install
from lmforge.local.ecr.responses import TOKEN_LIFETIME
from lmforge.local.ecr.store import restore_repositories
from lmforge.local.ecr.uris import EcrImage, parse_ecr_uri, resolve

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "TOKEN_LIFETIME",
    "EcrImage",
    "RegistryImage",
    "check_compatible",
    "install",
    "parse_ecr_uri",
    "resolve",
    "restore_repositories",
]
