/* A planted violation for check_attr_slots.sh, which must reject it. */
int planted(const ke_call *c) { return (int)c->a.i[0]; }
