package ipmi

import (
	"fmt"
	"strings"

	"github.com/bougou/go-ipmi/pkg/types"
)

// CompletionCodeError is an answer whose completion code is not 00h, "command completed normally"
// (IPMI v2.0 §5.2, Table 5-2).
type CompletionCodeError struct {
	// Command names the request ("Get System Boot Options", or "session setup" during activation).
	Command string
	// Code is the completion code.
	Code uint8
	// Meaning is the specification's words for Code: the command's own where it defines the code, else the generic.
	Meaning string

	permanent bool
}

func newCompletionCodeError(cmd types.Command, code uint8) *CompletionCodeError {
	meaningOf := cmd
	if cmd.Key() == sessionSetup.Key() {
		// Of the commands of session activation only Set Session Privilege Level defines codes of its own (Table 22-24).
		meaningOf = types.CommandSetSessionPrivilegeLevel
	}

	return &CompletionCodeError{
		Command:   cmd.Name,
		Code:      code,
		Meaning:   types.StrCC(meaningOf, code),
		permanent: permanentCompletionCode(cmd, code),
	}
}

// Error says the code in numbers and in words.
func (e *CompletionCodeError) Error() string {
	return fmt.Sprintf("the bmc answered completion code 0x%02x (%s)", e.Code, strings.ToLower(e.Meaning))
}

// Permanent reports whether the BMC will give the same answer to the same request: the request, the user's
// privilege or the BMC's configuration must change first.
func (e *CompletionCodeError) Permanent() bool { return e.permanent }

// permanentCompletionCode classifies a completion code (Table 5-2 for the generic codes 80h-BEh per command).
//
// Permanent: the BMC understood the request and refuses it as it is:
//
//	C1h invalid command, C2h invalid command for the LUN, C7h request data length invalid, C8h request data field
//	length limit exceeded, C9h parameter out of range, CAh cannot return the number of data bytes requested,
//	CBh requested data not present, CCh invalid data field in request, CDh command illegal for the sensor or record
//	type, D4h insufficient privilege, D6h sub-function disabled; for Set/Get System Boot Options 80h parameter not
//	supported and 82h parameter read-only (Tables 28-12, 28-13); during session activation every command-specific
//	code (requested privilege level not available or above the user's limit, Table 22-24).
//
// Retryable: everything else, chiefly C0h node busy, C3h timeout, C4h out of space, C5h reservation cancelled,
// C6h request data truncated (a damaged datagram), CEh response could not be provided, CFh duplicated request,
// D0h-D2h SDR update, firmware update or BMC initialisation in progress, D3h destination unavailable, D5h not
// supported in the present state (the state may change), FFh unspecified, 81h set in progress, and device-specific
// (OEM, 01h-7Eh) or command-specific codes this package does not know the meaning of.
func permanentCompletionCode(cmd types.Command, code uint8) bool {
	switch types.CompletionCode(code) {
	case types.CodeInvalidCommand, types.CodeInvalidCommandForLUN, types.CodeRequestDataLengthInvalid,
		types.CodeRequestDataLengthLimitExceeded, types.CodeParameterOutOfRange, types.CodeCannotReturnRequestedDataBytes,
		types.CodeRequestedDataNotPresent, types.CodeRequestDataFieldInvalid, types.CodeIllegalCommand,
		types.CodeInsufficientPrivilege, types.CodeSubFnDisabled:
		return true
	}

	if code < 0x80 || code > 0xbe {
		return false
	}

	switch cmd.Key() {
	case types.CommandSetSystemBootOptions.Key(), types.CommandGetSystemBootOptions.Key():
		return types.CompletionCode(code) == types.CodeParameterNotSupported || types.CompletionCode(code) == types.CodeParamConfigSetReadOnly
	case sessionSetup.Key():
		return true
	}

	return false
}

// SessionError is a refused session: an RMCP+ Open Session or RAKP answer whose status code is not 00h
// (IPMI v2.0 §13.24).
type SessionError struct {
	// Status is the RMCP+ status code.
	Status uint8
	// Meaning is the specification's words for Status.
	Meaning string
}

func newSessionError(status uint8) *SessionError {
	return &SessionError{Status: status, Meaning: types.RmcpStatusCode(status).String()}
}

// Error says the status in numbers and in words.
func (e *SessionError) Error() string {
	return fmt.Sprintf("the bmc refused the rmcp+ session: status 0x%02x (%s)", e.Status, strings.ToLower(e.Meaning))
}

// Permanent reports whether the refusal is for good: 03h-07h and 10h-12h (payload type, algorithms, cipher suite,
// parameter), 09h-0Ah (role, privilege level), 0Ch-0Eh (user name, GUID) and 0Fh (integrity check value: the
// password). 01h no resources, 02h and 08h invalid or inactive session ID, 0Bh no resources at the role and codes
// the specification reserves are retryable.
func (e *SessionError) Permanent() bool {
	switch types.RmcpStatusCode(e.Status) {
	case types.RmcpStatusCodeInvalidPayloadType, types.RmcpStatusCodeInvalidAuthAlg, types.RmcpStatusCodeInvalidIntegrityAlg,
		types.RmcpStatusCodeNoMatchingAuthPayload, types.RmcpStatusCodeNoMatchingIntegrityPayload,
		types.RmcpStatusCodeInvalidRole, types.RmcpStatusCodeUnauthorizedRoleOfPriLevel,
		types.RmcpStatusCodeInvalidNameLength, types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeUnauthorizedGUID,
		types.RmcpStatusCodeInvalidIntegrityCheckValue, types.RmcpStatusCodeInvalidConfidentAlg,
		types.RmcpStatusCodeNoCipherSuiteMatch, types.RmcpStatusCodeIllegalParameter:
		return true
	}

	return false
}
