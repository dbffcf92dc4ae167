/* The one monotonic clock the program times itself by (progress, ETAs, the watchdog, the
 * checkpoint writer, generate's speed): seconds since an arbitrary start, never going back. */
#ifndef TZ_CLOCK_H
#define TZ_CLOCK_H

double tz_clock_s(void);

#endif
