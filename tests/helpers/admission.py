"""A ValidatingAdmissionPolicy evaluated as the API server evaluates one on an update, for the rendered node
policies: ``object`` / ``oldObject`` the object after / before as plain maps (the API server hands CEL the
unstructured object, a dynamic map), ``request.userInfo`` the caller with its token's extras, the
``matchConditions`` first (all true, or the policy does not apply), then ``variables`` in order, then every
validation (false, or an error under ``failurePolicy: Fail``, denies).

The evaluator is cel-expr-python, Google's CEL runtime (cel-cpp): the language of the API server's cel-go,
type-checked with every variable dynamic, as the API server declares ``object`` and ``oldObject``.
"""

from __future__ import annotations

from typing import Any

from cel_expr_python import cel

NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"

_ENV = cel.NewEnv(variables={name: cel.Type.DYN for name in ("object", "oldObject", "request", "variables")})


def compile_cel(expression: str) -> None:
    """Parse and type-check ``expression`` (raises on a syntax or type error)."""
    _ENV.compile(expression)


def evaluate(expression: str, data: dict[str, Any]) -> Any:
    return _ENV.compile(expression).eval(data=data).plain_value()


def denials(
    policy: dict[str, Any],
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    user: str,
    node_claim: list[str] | None,
) -> list[str]:
    """The messages of the validations of ``policy`` that deny updating ``old`` to ``new`` by ``user``
    (whose token names ``node_claim`` as its node; None: no such claim); [] when admitted or when the
    policy does not apply to this request."""
    spec = policy["spec"]
    info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if node_claim is not None:
        info["extra"] = {NODE_NAME_CLAIM: node_claim, "authentication.kubernetes.io/pod-name": ["pod-x"]}
    request = {"operation": "UPDATE", "name": new["metadata"]["name"], "userInfo": info}
    data: dict[str, Any] = {"object": new, "oldObject": old, "request": request}
    if not all(evaluate(m["expression"], data) is True for m in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        variables[v["name"]] = evaluate(v["expression"], {**data, "variables": variables})
    denied = []
    for rule in spec["validations"]:
        scope = {**data, "variables": variables}
        try:
            ok = evaluate(rule["expression"], scope) is True
        except Exception as exc:  # failurePolicy: Fail: an error denies
            denied.append(f"error: {exc}")
            continue
        if not ok:
            message = rule["message"]
            if "messageExpression" in rule:
                message = evaluate(rule["messageExpression"], scope)
            denied.append(message)
    return denied
