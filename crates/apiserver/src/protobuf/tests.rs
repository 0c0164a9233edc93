use serde_json::{Value, json};
use shepherd_api::kinds;

use super::*;

fn round_trip(obj: &Value) -> Value {
    let pb = encode(obj).unwrap_or_else(|| panic!("{} has a protobuf form", obj["kind"])).expect("encodes");
    assert!(pb.starts_with(b"k8s\0"));
    decode(&pb).expect("decodes")
}

use shepherd_api::fixtures::full_meta as meta;

fn pod_spec() -> Value {
    json!({
        "containers": [{
            "name": "web", "image": "minimal", "args": ["serve", "--port=8080"], "command": ["/bin/app"],
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "env": [{"name": "A", "value": "1"},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "b", "optional": false}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
            "envFrom": [{"secretRef": {"name": "creds"}}],
            "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "250m"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                "periodSeconds": 5, "failureThreshold": 3},
            "livenessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 3},
            "startupProbe": {"tcpSocket": {"port": 8080}},
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}},
            "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File"}],
        "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420, "items": [{"key": "a", "path": "a.txt"}]}},
            {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 0, "dnsPolicy": "ClusterFirst",
        "nodeSelector": {"disk": "ssd"}, "serviceAccountName": "default", "nodeName": "node-1",
        "automountServiceAccountToken": false,
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 300}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
            "podAffinityTerm": {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                "values": ["web"]}]}, "topologyKey": "kubernetes.io/hostname"}}]}},
        "schedulerName": "default-scheduler", "priority": 0,
    })
}

fn template() -> Value {
    json!({"metadata": {"labels": {"app": "web"}}, "spec": pod_spec()})
}

fn list_of(kind: &str, api_version: &str, item: Value) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": api_version,
        "metadata": {"resourceVersion": "99", "continue": "abc"}, "items": [item]})
}

/// One realistic object of every kind Shepherd serves or receives, as a Kubernetes server writes it.
fn samples() -> Vec<Value> {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("web-0"), "spec": pod_spec(),
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
            "startTime": "2026-11-30T10:00:02Z", "qosClass": "Burstable",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:03Z"}],
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 2, "image": "minimal",
                "imageID": "sha256:abc", "containerID": "shepherd://1", "started": true,
                "state": {"running": {"startedAt": "2026-11-30T10:00:02Z"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                    "finishedAt": "2026-11-30T09:59:00Z"}}}]}});
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web"),
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}, "template": template(),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600},
        "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "availableReplicas": 2,
            "updatedReplicas": 2,
            "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                "lastUpdateTime": "2026-11-30T10:00:05Z", "lastTransitionTime": "2026-11-30T10:00:05Z"}]}});
    let replicaset = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta("web-1"),
        "spec": {"replicas": 2, "minReadySeconds": 5, "selector": {"matchLabels": {"app": "web"}},
            "template": template()},
        "status": {"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 1, "observedGeneration": 1}});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "uid": "u",
        "creationTimestamp": "2026-11-30T10:00:00Z"}, "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Terminating", "conditions": [{"type": "NamespaceDeletionContentFailure",
            "status": "False", "lastTransitionTime": "2026-11-30T10:00:00Z"}]}});
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
        "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"], "unschedulable": true,
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                "timeAdded": "2026-11-30T10:00:00Z"}]},
        "status": {"capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"}, "allocatable": {"cpu": "1900m"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": "2026-11-30T10:00:00Z", "lastTransitionTime": "2026-11-30T09:00:00Z"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                "osImage": "Debian", "containerRuntimeVersion": "shepherd://0.1", "kubeletVersion": "v1.33.0",
                "kubeProxyVersion": "v1.33.0", "operatingSystem": "linux", "architecture": "amd64"}}});
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("web"),
        "spec": {"type": "ClusterIP", "selector": {"app": "web"},
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "alt", "port": 81, "targetPort": "http", "protocol": "TCP"}],
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
        "status": {"loadBalancer": {}}});
    let endpoints = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("web"),
        "subsets": [{"addresses": [{"ip": "10.1.0.5", "nodeName": "node-1",
            "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-0", "uid": "u"}}],
            "notReadyAddresses": [{"ip": "10.1.0.6"}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]});
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("web.1"),
        "involvedObject": {"kind": "Deployment", "namespace": "default", "name": "web", "apiVersion": "apps/v1"},
        "reason": "ScalingReplicaSet", "message": "Scaled up", "type": "Normal", "count": 3,
        "source": {"component": "deployment-controller"}, "firstTimestamp": "2026-11-30T10:00:00Z",
        "lastTimestamp": "2026-11-30T10:00:09Z", "eventTime": "2026-11-30T10:00:00.123456Z",
        "reportingComponent": "deployment-controller", "reportingInstance": "shepherd"});
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta("node-1"),
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "acquireTime": "2026-11-30T10:00:00.000001Z",
            "renewTime": "2026-11-30T10:00:10.500000Z", "leaseTransitions": 0}});
    let mut out = vec![pod, deployment, replicaset, namespace, node, service, endpoints, event, lease];
    let lists: Vec<Value> = out
        .iter()
        .map(|o| {
            list_of(o["kind"].as_str().unwrap_or(""), o["apiVersion"].as_str().unwrap_or(""), {
                let mut item = o.clone();
                let item = item.as_object_mut().expect("object");
                item.remove("kind");
                item.remove("apiVersion");
                Value::Object(item.clone())
            })
        })
        .collect();
    out.extend(lists);
    out.extend([
        json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "propagationPolicy": "Foreground",
            "preconditions": {"uid": "u", "resourceVersion": "7"}, "dryRun": ["All"]}),
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": 409,
            "reason": "Conflict", "message": "the object has been modified",
            "details": {"name": "web", "group": "apps", "kind": "deployments",
                "causes": [{"reason": "FieldValueInvalid", "message": "bad", "field": "spec.replicas"}]}}),
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta("web"),
            "spec": {"replicas": 5}, "status": {"replicas": 2, "selector": "app=web"}}),
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web-0", "namespace": "default"},
            "target": {"kind": "Node", "name": "node-1", "apiVersion": "v1"}}),
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0", "namespace": "default"},
            "deleteOptions": {"gracePeriodSeconds": 30}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("web"),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"currentHealthy": 2, "desiredHealthy": 1, "disruptionsAllowed": 1, "expectedPods": 2,
                "disruptedPods": {"web-0": "2026-11-30T10:00:00Z"}, "observedGeneration": 1}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta("web-abc"),
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true,
                "serving": true, "terminating": false}, "nodeName": "node-1",
                "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "default"}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    ]);
    out
}

#[test]
fn every_kind_reads_back_as_the_json_it_was_written_from() {
    for obj in samples() {
        assert_eq!(round_trip(&obj), obj, "{} did not survive protobuf", obj["kind"]);
    }
}

#[test]
fn every_served_kind_and_its_list_has_a_protobuf_form() {
    // Custom resources and their definitions are served in JSON only, as Kubernetes serves custom resources.
    for res in kinds::ALL.iter().filter(|r| r.group != "apiextensions.k8s.io") {
        // Reviews are never listed: they have no list kind.
        let kinds = if kinds::is_review(res) { vec![res.kind.to_string()] } else { vec![res.kind.to_string(), res.list_kind()] };
        for kind in kinds {
            let obj = json!({"apiVersion": res.api_version(), "kind": kind, "metadata": {}});
            assert!(encode(&obj).is_some_and(|r| r.is_ok()), "{kind} has no protobuf message");
        }
    }
    let table = json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table", "rows": []});
    assert!(encode(&table).is_none(), "a Table is answered in JSON");
}

/// Bytes assembled by hand from the wire format, independent of the layout tables.
fn hand_built_delete_options() -> Vec<u8> {
    let mut raw = vec![0x08, 0x05]; // 1: gracePeriodSeconds = 5
    raw.extend([0x22, 10]); // 4: propagationPolicy
    raw.extend(b"Foreground");
    let type_meta = [&[0x0a, 2][..], b"v1", &[0x12, 13], b"DeleteOptions"].concat();
    [b"k8s\0".as_slice(), &[0x0a, type_meta.len() as u8], &type_meta, &[0x12, raw.len() as u8], &raw].concat()
}

#[test]
fn a_delete_options_body_as_client_go_sends_it_is_read() {
    let obj = decode(&hand_built_delete_options()).expect("decodes");
    assert_eq!(
        obj,
        json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 5,
        "propagationPolicy": "Foreground"})
    );
}

#[test]
fn special_types_take_their_kubernetes_json_shapes() {
    // A zero Time is an empty message and JSON null, as Go writes it; empty strings are unset; zero numbers are kept
    // because a pointer may hold them.
    let mut raw = Vec::new();
    // metadata: name "a", generateName "", creationTimestamp {}
    put_bytes(&mut raw, 1, &[0x0a, 1, b'a', 0x12, 0, 0x42, 0]);
    put_bytes(&mut raw, 2, &[0x08, 0]); // spec: replicas 0
    let type_meta = [&[0x0a, 7][..], b"apps/v1", &[0x12, 10], b"Deployment"].concat();
    let mut body = b"k8s\0".to_vec();
    put_bytes(&mut body, 1, &type_meta);
    put_bytes(&mut body, 2, &raw);
    let obj = decode(&body).expect("decodes");
    let meta = json!({"name": "a", "creationTimestamp": null});
    assert_eq!(obj, json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {"replicas": 0}}));

    // An empty string in a list is an element.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c", "args": ["", "x"]}]}});
    assert_eq!(round_trip(&pod), pod);
    // IntOrString: type 0 with intVal, type 1 with strVal; negative int32 as a 10-byte varint.
    let port = json!({"apiVersion": "v1", "kind": "Service", "spec": {"ports": [{"port": 80, "targetPort": -1}]}});
    assert_eq!(round_trip(&port), port);
    // Quantities stay strings; a number is written as its decimal string.
    let node = json!({"apiVersion": "v1", "kind": "Node", "status": {"capacity": {"cpu": 2}}});
    assert_eq!(round_trip(&node)["status"]["capacity"]["cpu"], "2");
    // Times are whole seconds; MicroTimes keep microseconds.
    let ev = json!({"apiVersion": "v1", "kind": "Event", "lastTimestamp": "2026-11-30T10:00:09.75Z",
        "eventTime": "2026-11-30T10:00:09.75Z"});
    let back = round_trip(&ev);
    assert_eq!(back["lastTimestamp"], "2026-11-30T10:00:09Z");
    assert_eq!(back["eventTime"], "2026-11-30T10:00:09.750000Z");
}

#[test]
fn go_zero_values_read_as_json_leaves_them_out_while_set_pointers_keep_their_zero() {
    // What Go writes for `kubectl create deployment --replicas=0`: every non-pointer field, zero or not.
    let sent = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "generation": 0},
        "spec": {"replicas": 0, "minReadySeconds": 0, "paused": false, "revisionHistoryLimit": 0,
            "template": {"metadata": {"generation": 0},
                "spec": {"hostNetwork": false, "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "stdin": false, "tty": false,
                    "ports": [{"containerPort": 80, "hostPort": 0}]}]}}}});
    let read = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 0, "revisionHistoryLimit": 0,
            "template": {"metadata": {},
                "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
                "containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}}}});
    assert_eq!(round_trip(&sent), read);
}

#[test]
fn fields_protobuf_cannot_carry_are_dropped_and_wrong_json_types_refuse_to_encode() {
    let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}, "extra": 1});
    assert_eq!(round_trip(&obj), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}));
    let bad = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": 7}});
    let err = encode(&bad).expect("has a form").expect_err("a number is not a name");
    assert!(err.to_string().contains("name"), "{err}");
}

#[test]
fn truncated_foreign_and_garbage_bodies_are_refused_with_a_reason() {
    let good = hand_built_delete_options();
    for cut in [5, 10, good.len() - 3] {
        let err = decode(&good[..cut]).expect_err("truncated");
        assert!(matches!(err, ProtobufError::Malformed(_)), "cut at {cut}: {err}");
    }
    assert_eq!(decode(br#"{"kind":"Pod"}"#), Err(ProtobufError::NoMagic));
    let err = decode(b"k8s\0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").expect_err("garbage");
    assert!(err.to_string().contains("truncated or malformed"), "{err}");
    let widget =
        encode_with(message("k8s.io.api.core.v1.Namespace").expect("ns"), "example.com/v1", "Widget", &json!({}))
            .expect("encodes");
    assert_eq!(
        decode(&widget),
        Err(ProtobufError::UnknownKind { api_version: "example.com/v1".into(), kind: "Widget".into() })
    );
    // A known field with the wrong wire type: metadata (a message) sent as a varint.
    let mut body = b"k8s\0".to_vec();
    put_bytes(&mut body, 1, &[&[0x0a, 2][..], b"v1", &[0x12, 9], b"Namespace"].concat());
    put_bytes(&mut body, 2, &[0x08, 1]);
    let err = decode(&body).expect_err("wrong wire type");
    assert!(err.to_string().contains("metadata"), "{err}");
}

#[test]
fn a_watch_frame_is_a_length_prefixed_event_holding_a_whole_body() {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "resourceVersion": "3"}});
    let frame = watch_frame("ADDED", &ns).expect("frame");
    let len = u32::from_be_bytes(frame[..4].try_into().expect("prefix")) as usize;
    assert_eq!(len, frame.len() - 4);
    let fields = read_fields(&frame[4..]).expect("event");
    assert!(matches!(fields[0], (1, Wire::Len(b"ADDED"))));
    let Some((2, Wire::Len(raw_ext))) = fields.get(1).copied() else { panic!("no object") };
    let Some((1, Wire::Len(body))) = read_fields(raw_ext).expect("raw extension").first().copied() else {
        panic!("no raw")
    };
    assert_eq!(decode(body).expect("object"), ns);
}

#[test]
fn a_token_request_reads_back_as_the_json_it_was_written_from() {
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "metadata": {"name": "bot", "namespace": "default", "creationTimestamp": "2026-11-30T10:00:00Z"},
        "spec": {"audiences": ["vault"], "expirationSeconds": 900,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "u-1"}},
        "status": {"token": "eyJ.a.b", "expirationTimestamp": "2026-11-30T10:15:00Z"}});
    assert_eq!(round_trip(&request), request);
}
