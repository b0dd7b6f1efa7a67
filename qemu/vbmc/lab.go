package vbmc

import (
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/bougou/go-ipmi/pkg/bmc"
)

// MachineStopped records that the machine turned itself off (a guest power-off), so the chassis reports
// it off without calling its hook. The lab calls it when a QEMU process exits on its own.
func (c *Chassis) MachineStopped() {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.on = false
}

// SetUser creates or updates an administrator on the BMC's LAN channel, as a host does in-band through
// its BMC interface (ipmitool user set name/password on /dev/ipmi0).
func (i *IPMI) SetUser(name, password string) error {
	id := uint8(0)

	if u, err := i.bmc.Users.GetByName(name); err == nil {
		id = u.ID
	} else {
		for candidate := uint8(3); candidate <= i.bmc.Users.MaxUserCount(); candidate++ {
			if _, err := i.bmc.Users.Get(candidate); errors.Is(err, bmc.ErrUserNotFound) {
				id = candidate

				break
			}
		}
	}

	if id == 0 {
		return fmt.Errorf("set ipmi user %s: no free user slot", name)
	}

	if err := i.bmc.Users.Upsert(id, func(u *bmc.User) error {
		u.Name = name
		u.SetPassword([]byte(password))
		u.Enabled = true
		if u.ChannelAccess == nil {
			u.ChannelAccess = map[uint8]bmc.UserChannelAccess{}
		}

		u.ChannelAccess[1] = bmc.UserChannelAccess{MaxPrivilege: bmc.PrivilegeLevelAdministrator, Enabled: true}

		return nil
	}); err != nil {
		return fmt.Errorf("set ipmi user %s: %w", name, err)
	}

	return nil
}

// SetAccount replaces the Redfish service's account (the lab mirrors the BMC user the agent provisions).
func (r *Redfish) SetAccount(user, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.opts.User, r.opts.Password = user, password
}

// CheckUser reports whether name is an enabled user whose password is password, compared as the BMC stores
// it (padded to the IPMI 2.0 length); Redfish services sharing the BMC's user table take it as an account.
func (i *IPMI) CheckUser(name, password string) bool {
	if name == "" || len(password) > bmc.MaxPasswordLen {
		return false
	}

	u, err := i.bmc.Users.GetByName(name)
	if err != nil || !u.Enabled {
		return false
	}

	var want bmc.User

	want.SetPassword([]byte(password))

	return subtle.ConstantTimeCompare(u.Password[:], want.Password[:]) == 1
}

// HasUser reports whether a user of that name exists on the BMC.
func (i *IPMI) HasUser(name string) bool {
	_, err := i.bmc.Users.GetByName(name)

	return err == nil
}
