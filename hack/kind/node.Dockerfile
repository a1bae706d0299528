# The kind node image, assembled from local parts only (see hack/kind-node.sh). The build context
# holds kind's own boot files (images/base/files of the pinned kind module) with our containerd
# config over them, and the binaries built from the pinned Go modules.
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
COPY files/ /
COPY bin/kubelet bin/kubeadm bin/kubectl /usr/bin/
COPY bin/crictl /usr/local/bin/
# containerd 2.x built by hack/kind-node.sh, where kind's containerd.service (ExecStart=
# /usr/local/bin/containerd) and kind's own image put it; the shim finds Debian's runc on PATH.
COPY bin/containerd bin/ctr bin/containerd-shim-runc-v2 /usr/local/bin/
COPY bin/cni/ /opt/cni/bin/
# One node, so the CNI config kindnetd would write for it is static (kindnetd cannot be built here).
COPY 10-pd-ptp.conflist /etc/cni/net.d/
ARG K8S_VERSION
# The same trimming and unit set-up as kind's base image; Debian's runc stands where kind's image
# puts its own build.
RUN set -e; \
    chmod 0755 /usr/local/bin/* /kind/bin/*; \
    ln -sf /usr/sbin/runc /usr/local/sbin/runc; \
    find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete; \
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*; \
    echo "ReadKMsg=no" >> /etc/systemd/journald.conf; \
    ln -sf /usr/lib/systemd/systemd /sbin/init; \
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service; \
    systemctl mask systemd-binfmt.service; \
    mkdir -p /etc/kubernetes/manifests; \
    ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json; \
    echo "v${K8S_VERSION}" > /kind/version; \
    containerd --version; runc --version; kubelet --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
