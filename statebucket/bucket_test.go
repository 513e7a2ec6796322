package statebucket_test

import (
	"testing"

	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
)

// TestEnsureRecordsTheContractVersionItIsCreatedWith: a bucket Ensure
// creates carries the contract version and the bridge's version in its
// metadata, as the stream and the archive do (publish's
// TestEnsureStreamAndArchiveRecordTheContractVersionTheyAreCreatedWith).
func TestEnsureRecordsTheContractVersionItIsCreatedWith(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ctx := t.Context()
	kv, err := statebucket.Ensure(ctx, js, statebucket.Options{Bucket: "PLEG_STATE", Manage: true, Version: "v1.4.0"})
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md := st.Metadata()
	if md[schemas.MetadataContractVersion] != schemas.ContractVersion || md[schemas.MetadataVersion] != "v1.4.0" {
		t.Errorf("state bucket: metadata %v, want %s=%s and %s=v1.4.0", md,
			schemas.MetadataContractVersion, schemas.ContractVersion, schemas.MetadataVersion)
	}
}
