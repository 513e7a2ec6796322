package schemas_test

import (
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestDataSchemaSaysTheContractVersion(t *testing.T) {
	t.Parallel()
	for _, ceType := range schemas.Types() {
		uri, _ := schemas.DataSchema(ceType)
		if !strings.Contains(uri, "/contract/"+schemas.ContractVersion+"/") {
			t.Errorf("DataSchema(%q) = %q, without contract version %s", ceType, uri, schemas.ContractVersion)
		}
		gotType, gotContract, ok := schemas.ParseDataSchema(uri)
		if gotType != ceType || gotContract != schemas.ContractVersion || !ok {
			t.Errorf("ParseDataSchema(%q) = %q, %q, %v; want %q, %q, true", uri, gotType, gotContract, ok, ceType, schemas.ContractVersion)
		}
	}
}

func TestParseDataSchema(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		uri      string
		ceType   string
		contract string
		ok       bool
	}{
		{"this contract's dataschema names its type and version",
			"https://pleg-bridge.dev/schemas/contract/2/v1/ContainerDied.json", schemas.TypeContainerDied, "2", true},
		{"a bridge's from before contract versions has no version",
			"https://pleg-bridge.dev/schemas/v1/ContainerDied.json", schemas.TypeContainerDied, "", true},
		{"a newer contract's is read",
			"https://pleg-bridge.dev/schemas/contract/17/v1/ContainerStarted.json", schemas.TypeContainerStarted, "17", true},
		{"an older contract's is read",
			"https://pleg-bridge.dev/schemas/contract/1/v1/ContainerRemoved.json", schemas.TypeContainerRemoved, "1", true},
		{"the base schema is no type's", "https://pleg-bridge.dev/schemas/contract/2/v1/event-data.json", "", "", false},
		{"a type pleg-bridge does not publish is rejected", "https://pleg-bridge.dev/schemas/contract/2/v1/ContainerChanged.json", "", "", false},
		{"another type version is rejected", "https://pleg-bridge.dev/schemas/contract/2/v2/ContainerDied.json", "", "", false},
		{"contract version 0 is rejected", "https://pleg-bridge.dev/schemas/contract/0/v1/ContainerDied.json", "", "", false},
		{"a contract version with a leading zero is rejected", "https://pleg-bridge.dev/schemas/contract/02/v1/ContainerDied.json", "", "", false},
		{"a contract version that is not a number is rejected", "https://pleg-bridge.dev/schemas/contract/v2/v1/ContainerDied.json", "", "", false},
		{"a contract segment without a version is rejected", "https://pleg-bridge.dev/schemas/contract/v1/ContainerDied.json", "", "", false},
		{"another host is rejected", "https://example.com/schemas/v1/ContainerDied.json", "", "", false},
		{"the empty string is rejected", "", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ceType, contract, ok := schemas.ParseDataSchema(tt.uri)
			if ceType != tt.ceType || contract != tt.contract || ok != tt.ok {
				t.Errorf("ParseDataSchema(%q) = %q, %q, %v; want %q, %q, %v", tt.uri, ceType, contract, ok, tt.ceType, tt.contract, tt.ok)
			}
		})
	}
}
