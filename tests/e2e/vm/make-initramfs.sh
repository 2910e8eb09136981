#!/bin/sh
# Builds the qemu driver's test VM from this machine's own files (tests/e2e/qemu.rs):
# Debian's kernel (linux-image-amd64) and an initramfs of busybox (busybox-static), OpenSSH's
# sshd with the libraries it and paddock link, the virtio network modules, a host key and an
# authorized key, and an /init that brings the network up and starts sshd. The VM lives in
# RAM: its disk (the session's qcow2 overlay) is attached but not needed.
#
#   make-initramfs.sh OUT_DIR AUTHORIZED_KEY_PUB PADDOCK_BINARY
#
# Writes OUT_DIR/vmlinuz and OUT_DIR/initrd.img.
set -eu
out=$1
pubkey=$2
paddock=$3
kernel=$(ls /boot/vmlinuz-* | sort -V | tail -n 1)
kver=${kernel#/boot/vmlinuz-}
root=$out/initramfs
rm -rf "$root"
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/etc/ssh" \
    "$root/root" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/run/sshd" \
    "$root/var/empty" "$root/lib/modules"
chmod 700 "$root/root"
cp /bin/busybox "$root/bin/busybox"
# A program and every library it links, at the same paths.
copy_linked() {
    mkdir -p "$root$(dirname "$1")"
    cp -L "$1" "$root$1"
    ldd "$1" | grep -o '/[^ ]*' | while read -r lib; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}
copy_linked /usr/sbin/sshd
# paddock is copied in by the driver; the libraries it needs must be there.
ldd "$paddock" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# The virtio network driver's modules, in the order modprobe would load them.
: > "$root/lib/modules/load"
for mod in virtio_pci virtio_net; do
    modprobe --show-depends -S "$kver" "$mod" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r ko; do
    cp "$ko" "$root/lib/modules/"
    basename "$ko" >> "$root/lib/modules/load"
done
ssh-keygen -q -t ed25519 -N "" -f "$root/etc/ssh/ssh_host_ed25519_key"
cp "$pubkey" "$root/etc/ssh/authorized_keys"
cat > "$root/etc/ssh/sshd_config" <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
AuthorizedKeysFile /etc/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AllowStreamLocalForwarding yes
CONF
printf 'root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
printf 'root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\n' > "$root/etc/shadow"
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
for m in $(cat /lib/modules/load); do
    insmod "/lib/modules/$m" || echo "paddock test VM: insmod $m failed"
done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
/usr/sbin/sshd -E /tmp/sshd.log
echo "paddock test VM: sshd started"
while true; do sleep 3600; done
INIT
chmod 755 "$root/init"
cp "$kernel" "$out/vmlinuz"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initrd.img"
