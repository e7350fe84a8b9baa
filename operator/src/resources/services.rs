//! The headless Service (peer DNS, cluster port, not-ready addresses published) and the
//! client Service (API port).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// `<fullname>-headless`: peer DNS for the StatefulSet, published before pods are ready so
/// nodes can find each other while bootstrapping.
pub fn headless_service(nc: &NaradCluster) -> Service {
    Service {
        metadata: owned_meta(nc, headless_name(nc)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(nc)),
            ports: Some(vec![port("cluster", CLUSTER_PORT)]),
            ..Default::default()
        }),
        status: None,
    }
}

/// `<fullname>`: the client Service (ClusterIP by default) on the API port.
pub fn client_service(nc: &NaradCluster) -> Service {
    let mut meta = owned_meta(nc, nc.fullname());
    if !nc.spec.service.annotations.is_empty() {
        meta.annotations = Some(nc.spec.service.annotations.clone());
    }
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some(nc.spec.service.type_.clone()),
            selector: Some(selector_labels(nc)),
            ports: Some(vec![port("api", API_PORT)]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cluster;
    use super::*;
    use serde_json::json;

    #[test]
    fn headless() {
        let nc = cluster(json!({"version": "1"}));
        let s = headless_service(&nc);
        assert_eq!(s.metadata.name.as_deref(), Some("prod-narad-headless"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let p = &spec.ports.unwrap()[0];
        assert_eq!((p.name.as_deref(), p.port), (Some("cluster"), 7943));
        assert_eq!(spec.selector.unwrap(), selector_labels(&nc));
    }

    #[test]
    fn client() {
        let nc = cluster(json!({"version": "1", "service": {
            "type": "LoadBalancer", "annotations": {"lb": "internal"}}}));
        let s = client_service(&nc);
        assert_eq!(s.metadata.name.as_deref(), Some("prod-narad"));
        assert_eq!(s.metadata.annotations.unwrap()["lb"], "internal");
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        let p = &spec.ports.unwrap()[0];
        assert_eq!((p.name.as_deref(), p.port), (Some("api"), 7942));
        let plain = client_service(&cluster(json!({"version": "1"})));
        assert_eq!(plain.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
        assert!(plain.metadata.annotations.is_none());
    }
}
