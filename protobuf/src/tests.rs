use super::*;
use decode::go_duration;

#[test]
fn objects_round_trip_through_protobuf() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "x"},
                     "creationTimestamp": "2026-01-02T03:04:05Z"},
        "spec": {"containers": [{"name": "c", "image": "x:1", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                  "resources": {"limits": {"cpu": "500m"}},
                                  "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5}}],
                 "volumes": [{"name": "v", "emptyDir": {}}], "terminationGracePeriodSeconds": 30}});
    let bytes = encode(&pod).unwrap_or_default();
    assert!(bytes.starts_with(MAGIC));
    let back = decode(&bytes).unwrap_or_default();
    assert_eq!(back, pod);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"k": "dmFsdWU="}, "type": "Opaque"});
    assert_eq!(
        decode(&encode(&secret).unwrap_or_default()).unwrap_or_default(),
        secret
    );
}

#[test]
fn custom_kinds_have_no_protobuf_form() {
    assert!(encode(&json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet"})).is_none());
    assert_eq!(go_duration(3_723_500_000_000), "1h2m3.5s");
    assert_eq!(parse_go_duration("1h2m3.5s"), 3_723_500_000_000);
}

#[test]
fn an_exact_encoding_refuses_what_the_schema_cannot_carry() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "x:1",
                                  "resources": {"limits": {"cpu": "500m"}},
                                  "livenessProbe": {"tcpSocket": {"port": 6818}}}],
                 "volumes": [{"name": "v", "configMap": {"name": "m", "defaultMode": 420}}]}});
    assert_eq!(encode_exact(&pod), Ok(encode(&pod).unwrap_or_default()));
    let mut newer = pod.clone();
    newer["spec"]["containers"][0]["futureField"] = json!(true);
    assert_eq!(
        encode_exact(&newer),
        Err("spec.containers[0].futureField".to_string())
    );
    let mut wrong = pod.clone();
    wrong["spec"]["volumes"][0]["configMap"]["defaultMode"] = json!("420");
    assert_eq!(
        encode_exact(&wrong),
        Err("spec.volumes[0].configMap.defaultMode".to_string())
    );
    assert!(encode_exact(&json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet"})).is_err());
}

#[test]
fn an_error_status_round_trips_through_protobuf() {
    let status = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "pods \"p\" already exists", "reason": "AlreadyExists",
        "details": {"name": "p", "kind": "pods"}, "code": 409});
    assert_eq!(
        decode(&encode(&status).unwrap_or_default()).unwrap_or_default(),
        status
    );
}

#[test]
fn watch_events_frame_and_decode_whatever_the_reads_cut() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "n", "resourceVersion": "7"},
        "spec": {"nodeName": "a", "containers": [{"name": "c", "image": "x:1"}],
                 "securityContext": {"supplementalGroups": [0, 5]}}});
    let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410,
        "reason": "Expired", "message": "too old resource version: 1 (7)", "metadata": {}});
    let mut stream = Vec::new();
    for (kind, obj) in [("ADDED", &pod), ("ERROR", &status)] {
        stream.extend(encode_watch_event(kind, obj).unwrap_or_default());
    }
    // Read one byte at a time, then all at once: the same two events.
    for chunk in [1, stream.len()] {
        let mut frames = Frames::default();
        let mut events = Vec::new();
        for piece in stream.chunks(chunk) {
            frames.push(piece);
            while let Ok(Some(message)) = frames.next_message() {
                events.push(decode_watch_event(&message).unwrap_or_default());
            }
        }
        assert!(!frames.is_partial());
        assert_eq!(
            events,
            [
                ("ADDED".to_string(), pod.clone()),
                ("ERROR".to_string(), status.clone())
            ]
        );
    }
    let mut cut = Frames::default();
    cut.push(&stream[..stream.len() - 1]);
    assert!(matches!(cut.next_message(), Ok(Some(_))));
    assert!(matches!(cut.next_message(), Ok(None)) && cut.is_partial());
    let mut broken = Frames::default();
    broken.push(&[0xff, 0xff, 0xff, 0xff]);
    assert!(broken.next_message().is_err());
}
