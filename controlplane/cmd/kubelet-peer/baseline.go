package main

// The baseline device plugin (--baseline-plugin-gpus, multi-node mode only): what a cluster
// without rocshare runs for amd.com/gpu, shaped like AMD's k8s-device-plugin — a fixed list of
// healthy whole GPUs, no preferred allocation, and an Allocate that hands each container
// /dev/kfd and the render nodes of the GPUs the kubelet chose. Benchmarks schedule the same pods
// through kube-scheduler without the extender against it, so the comparison isolates rocshare.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	baselineResource = "amd.com/gpu"
	baselineSocket   = "baseline-amdgpu.sock"
	firstRenderMinor = 128
)

type baselinePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	minors  map[string]int
}

func newBaselinePlugin(gpus int) *baselinePlugin {
	p := &baselinePlugin{minors: map[string]int{}}
	for i := 0; i < gpus; i++ {
		id := fmt.Sprintf("gpu-%d", i)
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		p.minors[id] = firstRenderMinor + i
	}
	return p
}

func (p *baselinePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *baselinePlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *baselinePlugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		specs := []*pluginapi.DeviceSpec{{ContainerPath: "/dev/kfd", HostPath: "/dev/kfd", Permissions: "rw"}}
		for _, id := range container.DevicesIds {
			minor, ok := p.minors[id]
			if !ok {
				return nil, fmt.Errorf("unknown device %q", id)
			}
			path := fmt.Sprintf("/dev/dri/renderD%d", minor)
			specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: path, HostPath: path, Permissions: "rw"})
		}
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{Devices: specs})
	}
	return response, nil
}

func (p *baselinePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// runBaselinePlugin serves in dir and registers with dir/kubelet.sock once the node's device
// manager listens there (not before: on start the device manager deletes every other socket in
// its folder). It does not re-register after a kubelet restart; benchmarks do not restart peers.
func runBaselinePlugin(ctx context.Context, dir string, gpus int) {
	kubeletSocket := filepath.Join(dir, "kubelet.sock")
	for {
		if _, err := os.Stat(kubeletSocket); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	socket := filepath.Join(dir, baselineSocket)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		klog.ErrorS(err, "Baseline plugin cannot listen", "socket", socket)
		return
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, newBaselinePlugin(gpus))
	go func() { _ = server.Serve(listener) }()
	go func() { <-ctx.Done(); server.Stop() }()
	for attempt := 1; ctx.Err() == nil; attempt++ {
		if err := registerBaseline(ctx, kubeletSocket); err == nil {
			return
		} else if attempt%20 == 0 {
			klog.ErrorS(err, "Baseline plugin registration failing", "dir", dir, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func registerBaseline(ctx context.Context, kubeletSocket string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	call, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(call, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: baselineSocket, ResourceName: baselineResource,
		Options: &pluginapi.DevicePluginOptions{}})
	return err
}
