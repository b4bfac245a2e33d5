"""A fake Kubernetes API server: the real REST and watch wire protocol over HTTP/1.1 on 127.0.0.1.

Tests, the demo and benchmarks start one (`with FakeApiServer() as api:`), write a kubeconfig pointing at
it (`api.write_kubeconfig(path)`) and run real clients against it: the agents as separate processes,
lightkube's AsyncClient, plain urllib, an operator under rehearsal.

Resources: Nodes, Pods (eviction subresource), Namespaces, ServiceAccounts, ConfigMaps, Services, Events
(core/v1); PodDisruptionBudgets (policy/v1: evictions that would break one get 429); DaemonSets,
Deployments, ControllerRevisions (apps/v1); ClusterRoles, ClusterRoleBindings, Roles, RoleBindings
(rbac.authorization.k8s.io/v1); RuntimeClasses (node.k8s.io/v1); Leases (coordination.k8s.io/v1);
ValidatingAdmissionPolicies and their bindings (admissionregistration.k8s.io/v1,
stored, never enforced); NFD NodeFeatures (nfd.k8s-sigs.io/v1alpha1); CustomResourceDefinitions
(apiextensions.k8s.io/v1) and, once one exists, its custom resources in every served version, cluster-
scoped or namespaced. Discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>`,
`/apis/<group>/<version>`) lists them all, custom groups and `<plural>/status` entries included.

What it does the way the real apiserver does:
- GET, LIST (label and field selectors), POST (201, 409 AlreadyExists), PUT (409 Conflict on a stale
  resourceVersion: Leases get their optimistic concurrency from this), PATCH (merge, strategic merge -
  415 for custom resources -, JSON patch, server-side apply; a write that changes nothing writes
  nothing), DELETE, and eviction; every error body is a `Status` with the real reason, code and message.
- Paginated lists: `limit` returns at most that many matching items and, while objects remain,
  `metadata.continue` (the apiserver's token: base64 of its version, resourceVersion and start key) and,
  without selectors, `remainingItemCount`; `continue` reads on as of the first page's resourceVersion (a
  consistent snapshot), 400 for a token that is not one (or with a resourceVersion), 410 Expired once its
  snapshot is gone (`list_snapshots` kept, least recently used first out; `compact()` drops them all).
- The /status subresource for DaemonSets, Deployments, CRDs and custom resources whose version declares
  `subresources.status`: writes through /status change only status; writes through the main resource
  keep the old status (and a create drops it). metadata.generation starts at 1 and is bumped by every
  change outside metadata and status of those types.
- managedFields and server-side apply (`Content-Type: application/apply-patch+yaml`, `?fieldManager=`
  required, `?force=true`): create-or-update (201/200), ownership per manager, and 409 Conflict with
  `FieldManagerConflict` causes. Ownership is simplified to leaf paths with atomic lists: see
  `gpunode.sim.apiserver.fieldmanager`. Apply bodies must be JSON (YAML's JSON subset).
- ownerReferences and garbage collection with background propagation: once an owner is deleted, each
  dependent without another live owner is deleted (pods honour the deletion delay); `Orphan` strips the
  reference instead. Deleting a Namespace deletes what is in it; deleting a CRD deletes its objects.
- One global resourceVersion; every write bumps it and is recorded for watchers. Watches send the
  current objects as ADDED (no resourceVersion or "0") or replay history after a resourceVersion, then
  stream live changes as newline-delimited JSON in HTTP chunks. A resourceVersion older than the
  retained history (or than `compact()`) gets one ERROR event with a 410 Expired Status. An object that
  starts or stops matching a watch's selectors arrives as ADDED or DELETED.
- A DaemonSet controller in miniature, for DaemonSets created through the API or `add_daemonset`: one pod
  per node that the template's nodeSelector matches and whose NoSchedule/NoExecute taints the template's
  tolerations (plus the controller's own node.kubernetes.io/* ones) tolerate; a pod goes when its node
  stops matching or gets an untolerated NoExecute taint. A ControllerRevision per template; a template
  change rolls out (RollingUpdate, maxUnavailable honoured; OnDelete leaves old pods). Status carries
  desired/current/updated/misscheduled/ready/available counts and observedGeneration. Pods are indexed by
  owner and node and each node's share of the counts is kept, so a node or pod write examines that node
  only: O(DaemonSets) per write (a template change examines every node). Daemon pods start
  Running (no kubelet needed; `daemon_pod_phase = "Pending"` leaves them unready until patched); an
  optional pod deletion delay (`pod_deletion_delay`) keeps a deleted pod terminating
  (metadata.deletionTimestamp set) for a while. Deployments get a status with every replica available.
- Hooks: `daemon_pod_status` gives new daemon pods their starting status (a crash-looping driver, a
  validator that is Ready); `observers` are called with every recorded write, in order, under the lock
  (a checker that must see every state the cluster passes through).
- Fault injection: failing or stalling the next requests, 403 for chosen verbs, dropping or stalling
  watch streams, forgetting history. Counters: `requests` (every request), `request_counts`
  ((verb, resource) -> served), `apply_conflicts`, `gc_deletions`, `watches_opened`.

What it deliberately does not do: admission (no defaulting beyond uid/timestamps/resourceVersion/generation
and a Pending phase for new pods, no validation beyond names and CRD structure, no OpenAPI schema validation
or pruning of custom resources), authentication or authorization beyond one optional bearer token and
`forbid()`, the inconsistent-continuation token a 410 for a stale continue carries, ignoring `limit` for
`resourceVersion=0` lists (the real one serves those whole from its cache), namespace existence checks,
finalizers, foreground deletion (treated as background), a /status subresource for Nodes and Pods (their main
resource may change status), list merging by key in strategic merge patches and apply (lists are replaced
whole), conversion webhooks, node affinity in DaemonSet scheduling, revision history limits, Deployments'
ReplicaSets and pods (a Deployment's status simply reports every replica available), protobuf, and YAML
request bodies.

Standard library only (and `gpunode.kube.selectors`, the label-selector parser the agents use, itself
standard library only): a `ThreadingHTTPServer` whose handler threads share one lock and condition.
"""

from gpunode.sim.apiserver.patches import (
    FieldRequirement,
    PatchError,
    json_patch,
    merge_patch,
    parse_field_selector,
    strategic_merge_patch,
)
from gpunode.sim.apiserver.server import (
    BUILTIN_TYPES,
    DEFAULT_USER,
    GIT_VERSION,
    NFD_GROUP,
    RESOURCES,
    ApiError,
    FakeApiServer,
    RequestRecord,
    ResourceType,
    WatchEvent,
    resource_type,
    status_body,
)

__all__ = [
    "BUILTIN_TYPES",
    "DEFAULT_USER",
    "GIT_VERSION",
    "NFD_GROUP",
    "RESOURCES",
    "ApiError",
    "FakeApiServer",
    "FieldRequirement",
    "PatchError",
    "RequestRecord",
    "ResourceType",
    "WatchEvent",
    "json_patch",
    "merge_patch",
    "parse_field_selector",
    "resource_type",
    "status_body",
    "strategic_merge_patch",
]
