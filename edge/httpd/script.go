package httpd

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// initScript loops over the interfaces: DHCP with bounded retries, then a bounded number of attempts to reach
// the edge (probe.ipxe), then one chain to boot.ipxe. A failed chain at that point is deliberate (HTTP 404 hands
// the machine to its disk, or it is denied): exit so the firmware tries its next boot entry. When no interface
// reaches the edge, reboot.
var initScript = template.Must(template.New("init").Parse(`#!ipxe
# Outpost edge: find an interface that reaches the edge, then chain to this machine's boot script.
set retries:int32 {{.Retries}}
set idx:int32 0
:iface
isset ${net${idx}/mac} || goto none
echo outpost: trying net${idx} ${net${idx}/mac}
set try:int32 0
:dhcp
dhcp net${idx} && goto probe ||
inc try
iseq ${try} ${retries} && goto next ||
sleep 1
goto dhcp
:probe
set try:int32 0
:probe_retry
imgfetch --name probe {{.Base}}/ipxe/probe.ipxe && goto chain ||
inc try
iseq ${try} ${retries} && goto next ||
sleep 2
goto probe_retry
:chain
imgfree probe ||
chain {{.Base}}/ipxe/boot.ipxe?uuid=${uuid}&mac=${net${idx}/mac:hexhyp}&arch=${buildarch}&platform=${platform} ||
echo outpost: no boot script for this machine, leaving it to the firmware
exit 1
:next
ifclose net${idx} ||
inc idx
goto iface
:none
echo outpost: no interface reached the edge, rebooting in 10 s
sleep 10
reboot
`))

// kernelScript fetches a kernel and an initrd with retries and boots them.
var kernelScript = template.Must(template.New("kernel").Parse(`#!ipxe
# Outpost edge: {{.Comment}}
set retries:int32 {{.Retries}}
set try:int32 0
:kernel
kernel {{.Kernel}} initrd=initrd {{.Args}} && goto initrd ||
inc try
iseq ${try} ${retries} && goto failed ||
sleep 2
goto kernel
:initrd
set try:int32 0
:initrd_retry
initrd --name initrd {{.Initrd}} && goto boot ||
inc try
iseq ${try} ${retries} && goto failed ||
sleep 2
goto initrd_retry
:boot
boot ||
:failed
echo outpost: boot failed, rebooting in 10 s
sleep 10
reboot
`))

// waitScript keeps a machine whose boot assets have not reached the site yet in iPXE: it waits, then asks for
// its boot script again, and boots once the assets are there. It never boots anything else meanwhile. When the
// chain fails (the plan changed to disk by HTTP 404, or deny), it leaves the machine to the firmware as
// init.ipxe does.
var waitScript = template.Must(template.New("wait").Parse(`#!ipxe
# Outpost edge: {{.Mode}} boot waits for {{.Missing}} boot asset(s) this site does not hold yet
echo outpost: waiting for {{.Missing}} boot asset(s) to reach this site, asking again in {{.Seconds}} s
sleep {{.Seconds}}
chain --replace {{.Again}} ||
echo outpost: no boot script for this machine now, leaving it to the firmware
exit 1
`))

const (
	exitScript    = "#!ipxe\n# Outpost edge: boot from disk\nexit 1\n"
	sanbootScript = "#!ipxe\n# Outpost edge: boot from disk\nsanboot --no-describe --drive 0x80 || exit 1\n"
	probeScript   = "#!ipxe\n# Outpost edge: reachable\n"
)

func renderInit(base string, retries int) []byte {
	var b bytes.Buffer
	if err := initScript.Execute(&b, struct {
		Base    string
		Retries int
	}{base, retries}); err != nil {
		panic(err) // the template is static: a failure is a programming error
	}

	return b.Bytes()
}

func renderWait(mode Mode, missing int, again string, seconds int) []byte {
	var b bytes.Buffer
	if err := waitScript.Execute(&b, struct {
		Mode    Mode
		Missing int
		Again   string
		Seconds int
	}{mode, missing, again, seconds}); err != nil {
		panic(fmt.Sprintf("render wait script: %v", err))
	}

	return b.Bytes()
}

func renderKernel(comment string, k *bootpb.Kernel, args []string, retries int) []byte {
	var b bytes.Buffer
	if err := kernelScript.Execute(&b, struct {
		Comment, Kernel, Initrd, Args string
		Retries                       int
	}{comment, k.GetKernelUrl(), k.GetInitrdUrl(), strings.Join(args, " "), retries}); err != nil {
		panic(fmt.Sprintf("render kernel script: %v", err))
	}

	return b.Bytes()
}

// Script renders the answer as an iPXE script; nil for a refusal.
func (a Answer) Script() []byte {
	switch a.Kind {
	case KindKernel:
		return renderKernel(a.Comment, a.Kernel, a.Args, a.Retries)
	case KindWait:
		return renderWait(a.Waiting, len(a.Missing), a.Again, a.WaitSeconds)
	case KindExit:
		return []byte(exitScript)
	case KindSanboot:
		return []byte(sanbootScript)
	default:
		return nil
	}
}
