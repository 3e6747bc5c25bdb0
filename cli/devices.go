package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
)

func devicesCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "devices",
		Usage:     "list this machine's devices and their attributes",
		UsageText: "kiln devices [--json]",
		Description: `Lists every device of every backend compiled into this binary (cpu, cuda)
with the attributes its backend reports (name, memory, compute version,
clock, …), the host CPU's target triple and feature flags, and, for each
backend that cannot be used here, why (no driver library, no device).

With --json it prints one JSON document instead of the table:
   {"host": {...}, "devices": [{"device": "cpu:0", "type": "cpu",
    "attrs": {"name": "...", ...}}], "absent": {"cuda": "reason"}}

Examples:
   kiln devices
   kiln devices --json | jq -r '.devices[].device'`,
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "json", Usage: "print one JSON document for machines instead of a table"},
		},
		OnUsageError: usageError,
		Action:       runDevices,
	}
}

// devicesReport is what `kiln devices --json` prints.
type devicesReport struct {
	Host    hostReport        `json:"host"`
	Devices []deviceReport    `json:"devices"`
	Absent  map[string]string `json:"absent"`
}

// hostReport describes the host CPU.
type hostReport struct {
	Model    string   `json:"model"`
	Arch     string   `json:"arch"`
	Triple   string   `json:"triple"`
	Cores    int      `json:"cores"`
	Features []string `json:"features"`
}

// deviceReport is one device and the attributes its backend supports.
type deviceReport struct {
	Device string            `json:"device"`
	Type   string            `json:"type"`
	Attrs  map[string]any    `json:"attrs"`
	Errors map[string]string `json:"errors,omitempty"`

	dev   devices.Device
	order []devices.AttrKind // supported attributes, in AllAttrs order
}

func runDevices(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	r := collectDevices()
	if c.Bool("json") {
		if err := json.NewEncoder(c.App.Writer).Encode(r); err != nil {
			return fmt.Errorf("write devices: %w", err)
		}
		return nil
	}
	if err := writeDeviceTable(c.App.Writer, r); err != nil {
		return fmt.Errorf("write devices: %w", err)
	}
	return nil
}

// collectDevices asks every registered backend about each of its devices.
func collectDevices() devicesReport {
	info := cpu.Info()
	r := devicesReport{
		Host: hostReport{
			Model:    info.Model,
			Arch:     info.Arch,
			Triple:   info.Triple,
			Cores:    info.Cores,
			Features: append([]string{}, info.Features...),
		},
		Devices: []deviceReport{},
		Absent:  map[string]string{},
	}
	for t, why := range devices.AbsentTypes() {
		r.Absent[t.String()] = why
	}
	for _, api := range devices.Registered() {
		n := api.Count()
		if n == 0 {
			if _, ok := r.Absent[api.Type().String()]; !ok {
				r.Absent[api.Type().String()] = "backend loaded, no device present"
			}
			continue
		}
		for id := 0; id < n; id++ {
			r.Devices = append(r.Devices, describe(api, devices.Device{Type: api.Type(), ID: int32(id)}))
		}
	}
	return r
}

func describe(api devices.DeviceAPI, dev devices.Device) deviceReport {
	d := deviceReport{Device: dev.String(), Type: dev.Type.String(), Attrs: map[string]any{}, dev: dev}
	for _, k := range devices.AllAttrs() {
		v, err := api.Attr(dev, k)
		switch {
		case errors.Is(err, devices.ErrUnsupportedAttr):
			continue
		case err != nil:
			if d.Errors == nil {
				d.Errors = map[string]string{}
			}
			d.Errors[k.String()] = err.Error()
		default:
			d.Attrs[k.String()] = v
		}
		d.order = append(d.order, k)
	}
	return d
}

func writeDeviceTable(w io.Writer, r devicesReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tATTRIBUTE\tVALUE")
	for _, d := range r.Devices {
		label := d.Device
		row := func(attr, value string) {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", label, attr, value)
			label = ""
		}
		for _, k := range d.order {
			if msg, bad := d.Errors[k.String()]; bad {
				row(k.String(), "error: "+msg)
				continue
			}
			row(k.String(), formatAttr(k, d.Attrs[k.String()]))
		}
		if d.dev.Type == devices.CPU && d.dev.ID == 0 {
			row("arch", r.Host.Arch)
			row("triple", r.Host.Triple)
			row("features", strings.Join(r.Host.Features, " "))
		}
	}
	absent := make([]string, 0, len(r.Absent))
	for t := range r.Absent {
		absent = append(absent, t)
	}
	sort.Strings(absent)
	for _, t := range absent {
		fmt.Fprintf(tw, "%s\tabsent: %s\n", t, r.Absent[t])
	}
	return tw.Flush()
}

// formatAttr renders one attribute value, adding a readable size to byte
// counts.
func formatAttr(k devices.AttrKind, v any) string {
	switch k {
	case devices.AttrTotalGlobalMemory, devices.AttrAvailableGlobalMemory,
		devices.AttrL2CacheSize, devices.AttrMaxSharedMemoryPerBlock:
		if n, ok := v.(int64); ok {
			return fmt.Sprintf("%d (%s)", n, humanBytes(n))
		}
	}
	return fmt.Sprint(v)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
