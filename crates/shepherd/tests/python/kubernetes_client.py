"""Drives a running Shepherd with the official Kubernetes Python client, as a user's script would.

Usage: kubernetes_client.py KUBECONFIG

Every check runs even when an earlier one failed; each prints "ok NAME" or "FAIL NAME: why", and
the exit status is 1 if any failed. The client deserializes every response into its typed models,
which refuse a missing required field: a check that reads an object also checks its shape.
"""

import sys
import time
import traceback

from kubernetes import client, config, dynamic, watch
from kubernetes.client.rest import ApiException

NS = "py-client"
TIMEOUT = 90


def wait_for(what, fn):
    """Polls fn until it returns a truthy value, for up to TIMEOUT seconds."""
    deadline = time.monotonic() + TIMEOUT
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what} (last: {last!r})")


def expect_api_error(status, fn):
    """Runs fn, which must fail with an ApiException of the given HTTP status; returns it."""
    try:
        fn()
    except ApiException as e:
        assert e.status == status, f"expected {status}, got {e.status}: {e.body}"
        return e
    raise AssertionError(f"expected an ApiException {status}, the call succeeded")


def deployment(name, replicas, labels):
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="minimal")]),
            ),
        ),
    )


def main():
    # As most scripts start: the server and credentials from a kubeconfig file.
    api_client = config.new_client_from_config(config_file=sys.argv[1])
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    failures = []

    def check(name):
        def run(fn):
            try:
                fn()
                print(f"ok {name}", flush=True)
            except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
                failures.append(name)
                print(f"FAIL {name}: {e}", flush=True)
                traceback.print_exc()
            return fn

        return run

    @check("VersionApi().get_code()")
    def _():
        version = client.VersionApi(api_client).get_code()
        assert version.major == "1" and version.git_version, version

    @check("ApisApi().get_api_versions()")
    def _():
        groups = {g.name: g for g in client.ApisApi(api_client).get_api_versions().groups}
        assert "apps" in groups, sorted(groups)
        assert groups["apps"].preferred_version.group_version == "apps/v1", groups["apps"]

    @check("CoreApi().get_api_versions()")
    def _():
        assert "v1" in client.CoreApi(api_client).get_api_versions().versions

    @check("AppsV1Api().get_api_resources()")
    def _():
        resources = {r.name: r for r in apps.get_api_resources().resources}
        assert "deployments" in resources and "deployments/scale" in resources, sorted(resources)
        assert "deploy" in (resources["deployments"].short_names or []), resources["deployments"]

    @check("CoreV1Api().create_namespace()")
    def _():
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        assert NS in [n.metadata.name for n in core.list_namespace().items]

    labels = {"app": "py-web"}

    @check("AppsV1Api: create, list and wait for a Deployment to be available")
    def _():
        created = apps.create_namespaced_deployment(NS, deployment("py-web", 2, labels))
        assert created.metadata.uid and created.metadata.resource_version, created.metadata
        names = [d.metadata.name for d in apps.list_namespaced_deployment(NS).items]
        assert names == ["py-web"], names
        assert "py-web" in [d.metadata.name for d in apps.list_deployment_for_all_namespaces().items]
        wait_for(
            "2 available replicas",
            lambda: (apps.read_namespaced_deployment_status("py-web", NS).status or NO_STATUS).available_replicas == 2,
        )

    @check("CoreV1Api: list the Deployment's pods with a label selector")
    def _():
        wait_for(
            "2 Running pods",
            lambda: [p.status.phase for p in core.list_namespaced_pod(NS, label_selector="app=py-web").items]
            == ["Running", "Running"],
        )

    @check("AppsV1Api: creating an existing Deployment is a 409 naming the kind and group")
    def _():
        e = expect_api_error(409, lambda: apps.create_namespaced_deployment(NS, deployment("py-web", 2, labels)))
        status = api_client.deserialize(FakeResponse(e.body), "V1Status")
        assert status.reason == "AlreadyExists", status
        assert status.details.kind == "deployments" and status.details.group == "apps", status.details
        assert status.details.name == "py-web", status.details

    @check("AppsV1Api: patch a Deployment (strategic merge) and scale it")
    def _():
        patched = apps.patch_namespaced_deployment(
            "py-web", NS, {"metadata": {"labels": {"tier": "front"}}, "spec": {"replicas": 3}}
        )
        assert patched.metadata.labels.get("tier") == "front", patched.metadata.labels
        assert patched.spec.replicas == 3
        scale = apps.patch_namespaced_deployment_scale("py-web", NS, {"spec": {"replicas": 1}})
        assert scale.spec.replicas == 1, scale
        assert apps.read_namespaced_deployment_scale("py-web", NS).spec.replicas == 1
        wait_for("1 pod left", lambda: len(core.list_namespaced_pod(NS, label_selector="app=py-web").items) == 1)

    @check("AppsV1Api: replace a Deployment with a stale resourceVersion is a 409 Conflict")
    def _():
        current = apps.read_namespaced_deployment("py-web", NS)
        stale = current.metadata.resource_version
        current.spec.replicas = 2
        apps.replace_namespaced_deployment("py-web", NS, current)
        current.metadata.resource_version = stale
        e = expect_api_error(409, lambda: apps.replace_namespaced_deployment("py-web", NS, current))
        status = api_client.deserialize(FakeResponse(e.body), "V1Status")
        assert status.reason == "Conflict", status
        assert status.details.kind == "deployments" and status.details.group == "apps", status.details

    @check("CoreV1Api: create, list, patch and read a Service, whose status is always there")
    def _():
        svc = client.V1Service(
            metadata=client.V1ObjectMeta(name="py-web"),
            spec=client.V1ServiceSpec(selector=labels, ports=[client.V1ServicePort(port=80, target_port=8080)]),
        )
        created = core.create_namespaced_service(NS, svc)
        assert created.status is not None and created.status.load_balancer is not None, created.status
        assert [s.metadata.name for s in core.list_namespaced_service(NS).items] == ["py-web"]
        patched = core.patch_namespaced_service("py-web", NS, {"metadata": {"annotations": {"owner": "py"}}})
        assert patched.metadata.annotations == {"owner": "py"}, patched.metadata.annotations
        read = core.read_namespaced_service("py-web", NS)
        assert read.status.load_balancer is not None, read.status
        wait_for("a cluster IP", lambda: core.read_namespaced_service("py-web", NS).spec.cluster_ip)
        wait_for(
            "the Service's endpoints",
            lambda: any(s.addresses for s in (core.read_namespaced_endpoints("py-web", NS).subsets or [])),
        )

    @check("watch.Watch().stream(list_namespaced_pod) sees a pod created after its list")
    def _():
        listed = core.list_namespaced_pod(NS)
        core.create_namespaced_pod(
            NS,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="py-pod", labels={"app": "py-pod"}),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(
                            name="main", image="minimal", command=["/bin/sh", "-c", "echo hello-from-py-pod; sleep 3600"]
                        )
                    ]
                ),
            ),
        )
        w = watch.Watch()
        seen = []
        for event in w.stream(
            core.list_namespaced_pod, NS, resource_version=listed.metadata.resource_version, timeout_seconds=TIMEOUT
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if event["type"] == "ADDED" and event["object"].metadata.name == "py-pod":
                assert isinstance(event["object"], client.V1Pod), type(event["object"])
                w.stop()
        assert ("ADDED", "py-pod") in seen, seen

    @check("CoreV1Api: read_namespaced_pod_log")
    def _():
        wait_for("py-pod Running", lambda: core.read_namespaced_pod("py-pod", NS).status.phase == "Running")
        wait_for("the pod's output", lambda: "hello-from-py-pod" in core.read_namespaced_pod_log("py-pod", NS))

    @check("typed lists of every other served kind deserialize: nodes, events, slices, leases")
    def _():
        nodes = core.list_node().items
        assert nodes and nodes[0].status.node_info.kubelet_version, nodes
        wait_for("an event in the namespace", lambda: core.list_namespaced_event(NS).items)
        wait_for(
            "the Service's EndpointSlice",
            lambda: client.DiscoveryV1Api(api_client).list_namespaced_endpoint_slice(
                NS, label_selector="kubernetes.io/service-name=py-web"
            ).items,
        )
        client.CoordinationV1Api(api_client).list_lease_for_all_namespaces()

    @check("PolicyV1Api: a PodDisruptionBudget refuses an eviction with 429")
    def _():
        policy = client.PolicyV1Api(api_client)
        policy.create_namespaced_pod_disruption_budget(
            NS,
            client.V1PodDisruptionBudget(
                metadata=client.V1ObjectMeta(name="py-pod"),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=1, selector=client.V1LabelSelector(match_labels={"app": "py-pod"})
                ),
            ),
        )
        wait_for(
            "the budget's status",
            lambda: (policy.read_namespaced_pod_disruption_budget_status("py-pod", NS).status or NO_PDB_STATUS)
            .current_healthy
            == 1,
        )
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="py-pod", namespace=NS))
        expect_api_error(429, lambda: core.create_namespaced_pod_eviction("py-pod", NS, eviction))
        policy.delete_namespaced_pod_disruption_budget("py-pod", NS)

    @check("dynamic.DynamicClient discovers and lists Deployments")
    def _():
        dyn = dynamic.DynamicClient(api_client)
        deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
        assert [d.metadata.name for d in deployments.get(namespace=NS).items] == ["py-web"]

    @check("unknown resources are 404, for reads and writes")
    def _():
        def call(method, path, body=None):
            return core.api_client.call_api(
                path, method, body=body, response_type="object", _return_http_data_only=True,
                header_params={"Content-Type": "application/json"},
            )

        expect_api_error(404, lambda: call("GET", f"/api/v1/namespaces/{NS}/widgets"))
        expect_api_error(404, lambda: call("POST", f"/api/v1/namespaces/{NS}/widgets", {"metadata": {"name": "w"}}))
        expect_api_error(404, lambda: call("GET", "/apis/nowhere.example.com/v1/widgets"))

    @check("ApiextensionsV1Api and CustomObjectsApi: a CRD, its custom objects and their status")
    def _():
        ext = client.ApiextensionsV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        schema = {
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
            },
        }
        ext.create_custom_resource_definition(
            client.V1CustomResourceDefinition(
                metadata=client.V1ObjectMeta(name="widgets.py.example.com"),
                spec=client.V1CustomResourceDefinitionSpec(
                    group="py.example.com",
                    scope="Namespaced",
                    names=client.V1CustomResourceDefinitionNames(plural="widgets", kind="Widget"),
                    versions=[
                        client.V1CustomResourceDefinitionVersion(
                            name="v1",
                            served=True,
                            storage=True,
                            schema=client.V1CustomResourceValidation(open_apiv3_schema=schema),
                            subresources=client.V1CustomResourceSubresources(status={}),
                        )
                    ],
                ),
            )
        )
        wait_for(
            "the CRD Established",
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition("widgets.py.example.com").status.conditions or []
            ),
        )
        widget = {"apiVersion": "py.example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}}
        gvr = ("py.example.com", "v1", NS, "widgets")
        before = custom.list_namespaced_custom_object(*gvr)["metadata"]["resourceVersion"]
        created = custom.create_namespaced_custom_object(*gvr, widget)
        assert created["metadata"]["uid"], created
        w = watch.Watch()
        first = None
        for event in w.stream(custom.list_namespaced_custom_object, *gvr, resource_version=before, timeout_seconds=TIMEOUT):
            first = (event["type"], event["object"]["metadata"]["name"])
            w.stop()
        assert first == ("ADDED", "w"), first
        assert [w["metadata"]["name"] for w in custom.list_namespaced_custom_object(*gvr)["items"]] == ["w"]
        patched = custom.patch_namespaced_custom_object(*gvr, "w", {"spec": {"size": 2}})
        assert patched["spec"]["size"] == 2, patched
        custom.patch_namespaced_custom_object_status(*gvr, "w", {"status": {"phase": "Ready"}})
        read = custom.get_namespaced_custom_object(*gvr, "w")
        assert read["status"] == {"phase": "Ready"} and read["spec"] == {"size": 2}, read
        custom.delete_namespaced_custom_object(*gvr, "w")
        expect_api_error(404, lambda: custom.get_namespaced_custom_object(*gvr, "w"))
        ext.delete_custom_resource_definition("widgets.py.example.com")

    @check("delete a Service and a Deployment with propagationPolicy=Foreground, and its pods go")
    def _():
        core.delete_namespaced_service("py-web", NS)
        expect_api_error(404, lambda: core.read_namespaced_service("py-web", NS))
        apps.delete_namespaced_deployment("py-web", NS, body=client.V1DeleteOptions(propagation_policy="Foreground"))
        wait_for("the Deployment gone", lambda: not apps.list_namespaced_deployment(NS).items)
        wait_for("its pods gone", lambda: not core.list_namespaced_pod(NS, label_selector="app=py-web").items)
        core.delete_namespaced_pod("py-pod", NS, grace_period_seconds=0)

    if failures:
        print(f"{len(failures)} check(s) failed: {failures}", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


NO_STATUS = client.V1DeploymentStatus()
NO_PDB_STATUS = client.V1PodDisruptionBudgetStatus(current_healthy=0, desired_healthy=0, disruptions_allowed=0, expected_pods=0)


class FakeResponse:
    """What ApiClient.deserialize reads: an error body, to be read as a typed V1Status."""

    def __init__(self, data):
        self.data = data


if __name__ == "__main__":
    main()
