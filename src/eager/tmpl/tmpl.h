/* tmpl/tmpl.h — what every template under tmpl/ shares: names pasted from a
 * prefix and a dtype suffix (KE_TCAT3(softmax_row, _, f32) -> softmax_row_f32).
 * A template is a real file included once per type with its parameters
 * #defined before and #undef'd by itself (Torch7 TH's generic/ files are the
 * model): gdb steps through its lines and errors point at them. */
#ifndef KE_TMPL_H
#define KE_TMPL_H
#define KE_TCAT3_(a, b, c) a##b##c
#define KE_TCAT3(a, b, c) KE_TCAT3_(a, b, c)
#endif
