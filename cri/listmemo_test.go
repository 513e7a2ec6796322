package cri

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// memoNode is a runtime whose listings a test decodes through one pair of
// memos, each next to a decoding without them.
type memoNode struct {
	rt    *crisim.Runtime
	codec listCodec
	memos *listMemos
}

func newMemoNode(t *testing.T) *memoNode {
	t.Helper()
	rt := crisim.NewRuntime(crisim.Options{})
	if err := rt.PopulateKubelet(6, 18); err != nil {
		t.Fatal(err)
	}
	return &memoNode{rt: rt, codec: newListCodec([]string{"team"}), memos: &listMemos{}}
}

// list decodes the node's listings (of sandbox sandboxID only, if not
// empty) through the memos, checks that they decode as they do without
// them, and returns the containers and sandboxes by ID.
func (n *memoNode) list(t *testing.T, sandboxID string) (map[string]*runtimeapi.Container, map[string]*runtimeapi.PodSandbox) {
	t.Helper()
	var sbFilter *runtimeapi.PodSandboxFilter
	var cFilter *runtimeapi.ContainerFilter
	if sandboxID != "" {
		sbFilter, cFilter = &runtimeapi.PodSandboxFilter{Id: sandboxID}, &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}
	}
	full := sandboxID == ""
	memoized := n.codec.withMemos(n.memos, full)

	var got runtimeapi.ListContainersResponse
	n.decodeBoth(t, memoized, &runtimeapi.ListContainersResponse{Containers: n.rt.ListContainers(cFilter)},
		&got, &runtimeapi.ListContainersResponse{})
	var gotSbs runtimeapi.ListPodSandboxResponse
	n.decodeBoth(t, memoized, &runtimeapi.ListPodSandboxResponse{Items: n.rt.ListPodSandbox(sbFilter)},
		&gotSbs, &runtimeapi.ListPodSandboxResponse{})
	byID := map[string]*runtimeapi.Container{}
	for _, c := range got.Containers {
		byID[c.GetId()] = c
	}
	sbByID := map[string]*runtimeapi.PodSandbox{}
	for _, sb := range gotSbs.Items {
		sbByID[sb.GetId()] = sb
	}
	return byID, sbByID
}

// decodeBoth decodes listing m into got through memoized, and into want
// without a memo, and fails the test if they differ.
func (n *memoNode) decodeBoth(t *testing.T, memoized listCodec, m, got, want proto.Message) {
	t.Helper()
	decodeWith(t, memoized, m, got)
	decodeWith(t, n.codec, m, want)
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("%T through the memo (-without +with):\n%s", m, diff)
	}
}

// remembered returns the items m holds.
func remembered[T any](m *listMemo[T]) map[string]memoItem[T] {
	items, _ := m.snapshot()
	return items
}

// reused counts the items of now that are the very items of before.
func reused[T comparable](before, now map[string]T) int {
	n := 0
	for id, v := range now {
		if before[id] == v {
			n++
		}
	}
	return n
}

func TestListMemoReusesWhatDidNotChange(t *testing.T) {
	t.Parallel()
	n := newMemoNode(t)
	first, firstSbs := n.list(t, "")
	if _, sbs := n.list(t, ""); reused(firstSbs, sbs) != 0 || len(remembered(&n.memos.containers)) != 0 {
		t.Fatal("a listing reused items, or the memo holds some, before it was armed")
	}
	n.memos.arm()
	second, secondSbs := n.list(t, "")
	if r := reused(first, second) + reused(firstSbs, secondSbs); r != 0 {
		t.Fatalf("the first full listing once armed reused %d items; it only fills the memo", r)
	}
	third, thirdSbs := n.list(t, "")
	if r := reused(second, third); r != len(third) {
		t.Fatalf("third full listing reused %d of %d containers, want all: nothing changed", r, len(third))
	}
	if r := reused(secondSbs, thirdSbs); r != len(thirdSbs) {
		t.Fatalf("third full listing reused %d of %d sandboxes, want all", r, len(thirdSbs))
	}

	// One container stops, one is removed, one is new; one sandbox stops.
	m := n.rt
	var ids []string
	for id := range third {
		ids = append(ids, id)
	}
	stopped, removed := ids[0], ids[1]
	must(0, m.StopContainer(stopped, 1, "Error", ""))
	must(0, m.StopContainer(removed, 0, "Completed", ""))
	must(0, m.RemoveContainer(removed))
	var sbID string
	for id := range thirdSbs {
		sbID = id
		break
	}
	added := must(m.CreateContainer(sbID, crisim.ContainerConfig{Name: "late"}))
	var stoppedSb string
	for id := range thirdSbs {
		if id != sbID {
			stoppedSb = id
			break
		}
	}
	must(0, m.StopPodSandbox(stoppedSb))

	// A targeted listing of one sandbox reads the memo and leaves it.
	one, _ := n.list(t, sbID)
	for id, c := range one {
		if was := third[id]; was != nil && was.GetState() == c.GetState() && c != was {
			t.Errorf("filtered listing decoded unchanged container %s again", id)
		}
	}

	fourth, fourthSbs := n.list(t, "")
	if fourth[stopped] == third[stopped] || fourth[stopped].GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("stopped container: reused %v, state %v; want decoded again, exited", fourth[stopped] == third[stopped], fourth[stopped].GetState())
	}
	if _, ok := fourth[removed]; ok {
		t.Errorf("removed container %s still listed", removed)
	}
	if fourth[added] == nil || fourth[added] == one[added] {
		t.Errorf("new container: listed %v; want decoded by the full listing, not taken from the filtered one", fourth[added] != nil)
	}
	// Stopping the sandbox stopped its containers too: each container is
	// reused exactly when its state is the one the memo holds.
	for id, c := range fourth {
		was, ok := third[id]
		if same := ok && was.GetState() == c.GetState(); (c == was) != same {
			t.Errorf("container %s: reused %v, state %v then %v", id, c == was, was.GetState(), c.GetState())
		}
	}
	if fourthSbs[stoppedSb] == thirdSbs[stoppedSb] || fourthSbs[stoppedSb].GetState() != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("stopped sandbox reused or not NOTREADY: %v", fourthSbs[stoppedSb].GetState())
	}
	if r, want := reused(thirdSbs, fourthSbs), len(thirdSbs)-1; r != want {
		t.Errorf("fourth full listing reused %d sandboxes, want %d", r, want)
	}
	// The memo forgets what the last full listing did not list.
	if _, ok := remembered(&n.memos.containers)[removed]; ok {
		t.Errorf("memo still holds removed container %s", removed)
	}
	if got, want := len(remembered(&n.memos.containers)), len(fourth); got != want {
		t.Errorf("memo holds %d containers, want the %d of the last full listing", got, want)
	}
}

// TestListMemoTellsARecreatedIDApart lists an item whose ID comes back with
// the same state but another creation time: it is decoded anew.
func TestListMemoTellsARecreatedIDApart(t *testing.T) {
	t.Parallel()
	memos := &listMemos{}
	memos.arm()
	c := newListCodec(nil).withMemos(memos, true)
	listing := func(created int64, image string) *runtimeapi.Container {
		resp := &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{
			Id: "c1", PodSandboxId: "sb", State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: created,
			Image: &runtimeapi.ImageSpec{Image: image},
		}}}
		var got runtimeapi.ListContainersResponse
		decodeWith(t, c, resp, &got)
		return got.Containers[0]
	}
	listing(1, "a:1")
	before := listing(1, "a:1")
	if again := listing(1, "a:1"); again != before {
		t.Fatal("an unchanged item was decoded again")
	}
	if got := listing(2, "b:2"); got == before || got.GetImage().GetImage() != "b:2" {
		t.Errorf("recreated ID: reused %v, image %q; want decoded anew with image b:2", got == before, got.GetImage().GetImage())
	}
}

// TestListMemoSurvivesAFailedListing: a listing cut short leaves the memo
// as it was, and the next listing still reuses it.
func TestListMemoSurvivesAFailedListing(t *testing.T) {
	t.Parallel()
	n := newMemoNode(t)
	n.memos.arm()
	n.list(t, "")
	before, _ := n.list(t, "")
	raw, err := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: n.rt.ListContainers(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var got runtimeapi.ListContainersResponse
	if err := n.codec.withMemos(n.memos, true).Unmarshal(pieces(raw[:len(raw)-3], 97), &got); err == nil {
		t.Fatal("a truncated listing decoded without error")
	}
	if got, want := len(remembered(&n.memos.containers)), len(before); got != want {
		t.Fatalf("memo holds %d containers after a failed listing, want %d", got, want)
	}
	after, _ := n.list(t, "")
	if r := reused(before, after); r != len(after) {
		t.Errorf("after a failed listing, %d of %d containers reused, want all", r, len(after))
	}
}

// TestListMemoVersionMovesWhenAFullListingDiffers: the memos' version
// stays put while full listings list exactly what the one before did, and
// moves on any other full listing: an item changed, gone or new, a failed
// listing, the first one once armed. Filtered listings leave it.
func TestListMemoVersionMovesWhenAFullListingDiffers(t *testing.T) {
	t.Parallel()
	n := newMemoNode(t)
	if _, ok := n.memos.version(); ok {
		t.Fatal("version reported before the memos were armed")
	}
	n.memos.arm()
	version := func() uint64 {
		t.Helper()
		v, ok := n.memos.version()
		if !ok {
			t.Fatal("no version once armed")
		}
		return v
	}
	step := func(what string, change func(), list func(), wantMoved bool) {
		t.Helper()
		change()
		before := version()
		list()
		if moved := version() != before; moved != wantMoved {
			t.Errorf("%s: version moved %v, want %v", what, moved, wantMoved)
		}
	}
	full := func() { n.list(t, "") }
	nothing := func() {}
	step("the first full listing once armed", nothing, full, true)
	step("the same listing again", nothing, full, false)
	containers, sandboxes := n.list(t, "")
	var ids, sbIDs []string
	for id := range containers {
		ids = append(ids, id)
	}
	for id := range sandboxes {
		sbIDs = append(sbIDs, id)
	}
	m := n.rt
	step("a filtered listing", func() { must(0, m.StopContainer(ids[0], 1, "Error", "")) },
		func() { n.list(t, sbIDs[0]) }, false)
	step("a container stopped", nothing, full, true)
	step("nothing since", nothing, full, false)
	step("a container removed", func() {
		must(0, m.StopContainer(ids[1], 0, "Completed", ""))
		n.list(t, "")
		must(0, m.RemoveContainer(ids[1]))
	}, full, true)
	step("a container created", func() { must(m.CreateContainer(sbIDs[0], crisim.ContainerConfig{Name: "late"})) }, full, true)
	step("a sandbox stopped", func() { must(0, m.StopPodSandbox(sbIDs[1])) }, full, true)
	step("nothing since", nothing, full, false)
	step("a listing cut short", nothing, func() {
		raw, err := proto.Marshal(&runtimeapi.ListContainersResponse{Containers: m.ListContainers(nil)})
		if err != nil {
			t.Fatal(err)
		}
		var got runtimeapi.ListContainersResponse
		if err := n.codec.withMemos(n.memos, true).Unmarshal(pieces(raw[:len(raw)-3], 97), &got); err == nil {
			t.Fatal("a truncated listing decoded without error")
		}
	}, true)
	step("the same listing as before the cut", nothing, full, false)
}

// TestListMemoAnItemListedTwiceIsNotTheSameListing: a listing that names
// one remembered item twice and leaves another out lists as many items as
// the memo holds, all of them remembered; it is still a change.
func TestListMemoAnItemListedTwiceIsNotTheSameListing(t *testing.T) {
	t.Parallel()
	memos := &listMemos{}
	memos.arm()
	c := newListCodec(nil).withMemos(memos, true)
	item := func(id string) *runtimeapi.Container {
		return &runtimeapi.Container{Id: id, PodSandboxId: "sb", State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: 1}
	}
	moved := func(ids ...string) bool {
		t.Helper()
		before, _ := memos.version()
		resp := &runtimeapi.ListContainersResponse{}
		for _, id := range ids {
			resp.Containers = append(resp.Containers, item(id))
		}
		var got runtimeapi.ListContainersResponse
		decodeWith(t, c, resp, &got)
		after, _ := memos.version()
		return after != before
	}
	if !moved("c1", "c2") || moved("c1", "c2") || moved("c2", "c1") {
		t.Fatal("want: the first listing moves the version, the same items again (in any order) do not")
	}
	if !moved("c1", "c1") {
		t.Error("c1 listed twice and c2 left out did not move the version")
	}
	if moved("c1") {
		t.Error("c1 alone after c1 twice moved the version; the memo should hold c1 only")
	}
}
