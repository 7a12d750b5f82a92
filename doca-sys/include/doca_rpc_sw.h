/*
 * doca_rpc_sw.h: the subset of the NVIDIA DOCA C API (DOCA 2.9+ task / progress-engine API,
 * RDMA, memory and common calls) that rdma-rpc uses, declared by this project from the
 * documented signatures. This file is NOT an NVIDIA header: it is written for the software
 * provider of the `doca-sys` crate, and its declarations match DOCA's so that the same calling
 * code compiles against the real SDK.
 *
 * The committed Rust bindings `src/bindings_software.rs` are generated from this file by
 * `scripts/regen-bindings.sh`; `scripts/check-bindings.sh` verifies they are up to date.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef DOCA_RPC_SW_H
#define DOCA_RPC_SW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Shared types                                                                               */
/* ------------------------------------------------------------------------------------------ */

/** Status code returned by almost every DOCA call. New values appear between releases. */
typedef enum doca_error {
	/** Success. */
	DOCA_SUCCESS = 0,
	/** Unknown error. */
	DOCA_ERROR_UNKNOWN = 1,
	/** Operation not permitted. */
	DOCA_ERROR_NOT_PERMITTED = 2,
	/** Resource already in use. */
	DOCA_ERROR_IN_USE = 3,
	/** Operation not supported. */
	DOCA_ERROR_NOT_SUPPORTED = 4,
	/** Resource temporarily unavailable, try again. */
	DOCA_ERROR_AGAIN = 5,
	/** Invalid input. */
	DOCA_ERROR_INVALID_VALUE = 6,
	/** Memory allocation failure. */
	DOCA_ERROR_NO_MEMORY = 7,
	/** Resource initialization failure. */
	DOCA_ERROR_INITIALIZATION = 8,
	/** Timer expired waiting for resource. */
	DOCA_ERROR_TIME_OUT = 9,
	/** Shut down in process or completed. */
	DOCA_ERROR_SHUTDOWN = 10,
	/** Connection reset by peer. */
	DOCA_ERROR_CONNECTION_RESET = 11,
	/** Connection aborted. */
	DOCA_ERROR_CONNECTION_ABORTED = 12,
	/** Connection in progress. */
	DOCA_ERROR_CONNECTION_INPROGRESS = 13,
	/** Not connected. */
	DOCA_ERROR_NOT_CONNECTED = 14,
	/** Unable to acquire the required lock. */
	DOCA_ERROR_NO_LOCK = 15,
	/** Resource not found. */
	DOCA_ERROR_NOT_FOUND = 16,
	/** Input/output operation failed. */
	DOCA_ERROR_IO_FAILED = 17,
	/** Bad state for the requested operation. */
	DOCA_ERROR_BAD_STATE = 18,
	/** Unsupported version. */
	DOCA_ERROR_UNSUPPORTED_VERSION = 19,
	/** Operating system call failure. */
	DOCA_ERROR_OPERATING_SYSTEM = 20,
	/** Device driver failure. */
	DOCA_ERROR_DRIVER = 21,
	/** Unexpected result. */
	DOCA_ERROR_UNEXPECTED = 22,
	/** Resource already exists. */
	DOCA_ERROR_ALREADY_EXIST = 23,
	/** No more space. */
	DOCA_ERROR_FULL = 24,
	/** No entry is available. */
	DOCA_ERROR_EMPTY = 25,
	/** Operation in progress. */
	DOCA_ERROR_IN_PROGRESS = 26,
	/** Requested operation too big. */
	DOCA_ERROR_TOO_BIG = 27,
	/** Authentication failure. */
	DOCA_ERROR_AUTHENTICATION = 28,
	/** Configuration is not valid. */
	DOCA_ERROR_BAD_CONFIG = 29,
	/** Operation was skipped. */
	DOCA_ERROR_SKIPPED = 30,
} doca_error_t;

/** Returns the static name of an error code, e.g. "DOCA_ERROR_BAD_STATE". */
const char *doca_error_get_name(doca_error_t error);
/** Returns a static, human-readable description of an error code. */
const char *doca_error_get_descr(doca_error_t error);

/** Memory access permission bits (`uint32_t` masks). */
enum doca_access_flag {
	/** Local read only. */
	DOCA_ACCESS_FLAG_LOCAL_READ_ONLY = 0,
	/** Local read and write. */
	DOCA_ACCESS_FLAG_LOCAL_READ_WRITE = (1 << 0),
	/** Remote RDMA read. */
	DOCA_ACCESS_FLAG_RDMA_READ = (1 << 1),
	/** Remote RDMA write. */
	DOCA_ACCESS_FLAG_RDMA_WRITE = (1 << 2),
	/** Remote RDMA atomics. */
	DOCA_ACCESS_FLAG_RDMA_ATOMIC = (1 << 3),
	/** PCI read only. */
	DOCA_ACCESS_FLAG_PCI_READ_ONLY = (1 << 4),
	/** PCI read and write. */
	DOCA_ACCESS_FLAG_PCI_READ_WRITE = (1 << 5),
	/** PCI relaxed ordering. */
	DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING = (1 << 6),
};

/** User data attached to DOCA objects; passed by value. */
union doca_data {
	/** Pointer view. */
	void *ptr;
	/** Integer view. */
	uint64_t u64;
};

/** A 32-bit big-endian value (`__be32`). */
typedef uint32_t doca_be32_t;

/** Notification handle of a progress engine: a file descriptor on Linux. */
typedef int doca_notification_handle_t;

/** Size of the buffer given to `doca_devinfo_get_ibdev_name`. */
#define DOCA_DEVINFO_IBDEV_NAME_SIZE 64
/** Size of the buffer given to `doca_devinfo_get_pci_addr_str`. */
#define DOCA_DEVINFO_PCI_ADDR_SIZE 13

/* ------------------------------------------------------------------------------------------ */
/* Opaque objects                                                                             */
/* ------------------------------------------------------------------------------------------ */

struct doca_devinfo;
struct doca_dev;
struct doca_pe;
struct doca_ctx;
struct doca_task;
struct doca_rdma;
struct doca_rdma_connection;
struct doca_rdma_addr;
struct doca_mmap;
struct doca_buf_inventory;
struct doca_buf;
struct doca_rdma_task_receive;
struct doca_rdma_task_send;
struct doca_rdma_task_send_imm;
struct doca_rdma_task_read;
struct doca_rdma_task_write;
struct doca_rdma_task_write_imm;
struct doca_rdma_task_atomic_cmp_swp;
struct doca_rdma_task_atomic_fetch_add;

/* ------------------------------------------------------------------------------------------ */
/* Device (doca_dev.h)                                                                        */
/* ------------------------------------------------------------------------------------------ */

/** Creates the list of available devices. Free it with `doca_devinfo_destroy_list`. */
doca_error_t doca_devinfo_create_list(struct doca_devinfo ***dev_list, uint32_t *nb_devs);
/** Destroys a list made by `doca_devinfo_create_list`. */
doca_error_t doca_devinfo_destroy_list(struct doca_devinfo **dev_list);
/** Copies the IB device name (NUL-terminated) into `ibdev_name` (`size` >= 64). */
doca_error_t doca_devinfo_get_ibdev_name(const struct doca_devinfo *devinfo, char *ibdev_name, uint32_t size);
/** Copies the PCI address string (NUL-terminated, 13 bytes) into `pci_addr_str`. */
doca_error_t doca_devinfo_get_pci_addr_str(const struct doca_devinfo *devinfo, char *pci_addr_str);
/** Opens a device. */
doca_error_t doca_dev_open(struct doca_devinfo *devinfo, struct doca_dev **dev);
/** Closes a device. */
doca_error_t doca_dev_close(struct doca_dev *dev);
/** Returns the device information of an open device. */
struct doca_devinfo *doca_dev_as_devinfo(const struct doca_dev *dev);

/* ------------------------------------------------------------------------------------------ */
/* Progress engine and context (doca_pe.h, doca_ctx.h)                                        */
/* ------------------------------------------------------------------------------------------ */

/** Context states. */
enum doca_ctx_states {
	/** Not started (or fully stopped). */
	DOCA_CTX_STATE_IDLE = 0,
	/** Starting. */
	DOCA_CTX_STATE_STARTING = 1,
	/** Running. */
	DOCA_CTX_STATE_RUNNING = 2,
	/** Stopping: outstanding tasks are being flushed. */
	DOCA_CTX_STATE_STOPPING = 3,
};

/** Called from `doca_pe_progress` when a context changes state. */
typedef void (*doca_ctx_state_changed_callback_t)(const union doca_data user_data, struct doca_ctx *ctx,
						  enum doca_ctx_states prev_state,
						  enum doca_ctx_states next_state);

/** Creates a progress engine. */
doca_error_t doca_pe_create(struct doca_pe **pe);
/** Destroys a progress engine (no context may be connected). */
doca_error_t doca_pe_destroy(struct doca_pe *pe);
/** Connects an idle context to a progress engine. */
doca_error_t doca_pe_connect_ctx(struct doca_pe *pe, struct doca_ctx *ctx);
/** Runs pending completion and connection callbacks; returns 1 if anything happened. */
uint8_t doca_pe_progress(struct doca_pe *pe);
/** Returns the notification handle (an fd) of the progress engine. */
doca_error_t doca_pe_get_notification_handle(const struct doca_pe *pe, doca_notification_handle_t *handle);
/** Arms the notification handle. */
doca_error_t doca_pe_request_notification(struct doca_pe *pe);
/** Clears (drains) the notification handle. */
doca_error_t doca_pe_clear_notification(struct doca_pe *pe, doca_notification_handle_t handle);

/** Flags of doca_task_submit_ex (a bitwise or). */
enum doca_task_submit_flag {
	/** Accept the task without handing it to the hardware yet (it may be aggregated). */
	DOCA_TASK_SUBMIT_FLAG_NONE = 0U,
	/** Hand this task and every earlier unflushed task of its context to the hardware. */
	DOCA_TASK_SUBMIT_FLAG_FLUSH = (1U << 0),
	/** Allow the context to report completions of a batch together. */
	DOCA_TASK_SUBMIT_FLAG_OPTIMIZE_REPORTS = (1U << 1),
};

/** Submits a task; on success DOCA owns it until its completion callback. */
doca_error_t doca_task_submit(struct doca_task *task);
/** doca_task_submit with flags (enum doca_task_submit_flag); without FLUSH the task may wait. */
doca_error_t doca_task_submit_ex(struct doca_task *task, uint32_t flags);
/** Frees a task that is not in flight. */
void doca_task_free(struct doca_task *task);
/** Returns the status of the last completion of a task. */
doca_error_t doca_task_get_status(const struct doca_task *task);
/** Returns the user data of a task. */
union doca_data doca_task_get_user_data(const struct doca_task *task);
/** Sets the user data of a task. */
void doca_task_set_user_data(struct doca_task *task, union doca_data user_data);

/** Starts a context (needs a progress engine). */
doca_error_t doca_ctx_start(struct doca_ctx *ctx);
/** Stops a context; IN_PROGRESS while tasks are outstanding or allocated. */
doca_error_t doca_ctx_stop(struct doca_ctx *ctx);
/** Reads the state of a context. */
doca_error_t doca_ctx_get_state(const struct doca_ctx *ctx, enum doca_ctx_states *state);
/** Sets the state-changed callback (idle context). */
doca_error_t doca_ctx_set_state_changed_cb(struct doca_ctx *ctx, doca_ctx_state_changed_callback_t cb);
/** Sets the context user data. */
doca_error_t doca_ctx_set_user_data(struct doca_ctx *ctx, union doca_data user_data);
/** Hands the tasks submitted without DOCA_TASK_SUBMIT_FLAG_FLUSH to the hardware (not idle). */
void doca_ctx_flush_tasks(struct doca_ctx *ctx);

/* ------------------------------------------------------------------------------------------ */
/* RDMA context and connections (doca_rdma.h)                                                 */
/* ------------------------------------------------------------------------------------------ */

/** Address types for RDMA CM. */
enum doca_rdma_addr_type {
	/** IPv4 address. */
	DOCA_RDMA_ADDR_TYPE_IPv4 = 0,
	/** IPv6 address. */
	DOCA_RDMA_ADDR_TYPE_IPv6 = 1,
	/** GID. */
	DOCA_RDMA_ADDR_TYPE_GID = 2,
};

/** RDMA transport types. */
enum doca_rdma_transport_type {
	/** Reliable connection. */
	DOCA_RDMA_TRANSPORT_TYPE_RC = 0,
	/** Dynamically connected. */
	DOCA_RDMA_TRANSPORT_TYPE_DC = 1,
};

/** Opcode of a completed receive. */
enum doca_rdma_opcode {
	/** Received a send. */
	DOCA_RDMA_OPCODE_RECV_SEND = 0,
	/** Received a send with immediate. */
	DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM = 1,
	/** Received a write with immediate. */
	DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM = 2,
};

/** Server side: a peer asks to connect. */
typedef void (*doca_rdma_connection_request_cb_t)(struct doca_rdma_connection *rdma_connection,
						 union doca_data ctx_user_data);
/** The connection is established and usable. */
typedef void (*doca_rdma_connection_established_cb_t)(struct doca_rdma_connection *rdma_connection,
						     union doca_data connection_user_data,
						     union doca_data ctx_user_data);
/** The connection attempt failed. */
typedef void (*doca_rdma_connection_failure_cb_t)(struct doca_rdma_connection *rdma_connection,
						 union doca_data connection_user_data,
						 union doca_data ctx_user_data);
/** The peer disconnected; call `doca_rdma_connection_disconnect` to finish. */
typedef void (*doca_rdma_connection_disconnection_cb_t)(struct doca_rdma_connection *rdma_connection,
						       union doca_data connection_user_data,
						       union doca_data ctx_user_data);

/** Creates an RDMA context on a device. */
doca_error_t doca_rdma_create(struct doca_dev *dev, struct doca_rdma **rdma);
/** Destroys a stopped RDMA context. */
doca_error_t doca_rdma_destroy(struct doca_rdma *rdma);
/** Returns the generic context of an RDMA context. */
struct doca_ctx *doca_rdma_as_ctx(struct doca_rdma *rdma);
/** Sets the access permissions of the context (idle only). */
doca_error_t doca_rdma_set_permissions(struct doca_rdma *rdma, uint32_t permissions);
/** Sets the GID index (idle only). */
doca_error_t doca_rdma_set_gid_index(struct doca_rdma *rdma, uint32_t gid_index);
/** Sets the maximum number of connections (idle only). */
doca_error_t doca_rdma_set_max_num_connections(struct doca_rdma *rdma, uint16_t max_num_connections);
/** Sets the send queue size (idle only). */
doca_error_t doca_rdma_set_send_queue_size(struct doca_rdma *rdma, uint32_t send_queue_size);
/** Sets the receive queue size (idle only). */
doca_error_t doca_rdma_set_recv_queue_size(struct doca_rdma *rdma, uint32_t recv_queue_size);
/** Sets the transport type (idle only). */
doca_error_t doca_rdma_set_transport_type(struct doca_rdma *rdma, enum doca_rdma_transport_type transport_type);
/** Sets the connection request timeout in milliseconds (idle only). */
doca_error_t doca_rdma_set_connection_request_timeout(struct doca_rdma *rdma, uint16_t timeout);
/** Sets how often a send retries when the peer has no receive posted (idle only). */
doca_error_t doca_rdma_set_rnr_retry_count(struct doca_rdma *rdma, uint8_t rnr_retry_count);
/** Reads the receiver-not-ready retry count. */
doca_error_t doca_rdma_get_rnr_retry_count(const struct doca_rdma *rdma, uint8_t *rnr_retry_count);
/** Sets the connection state callbacks (idle only). */
doca_error_t doca_rdma_set_connection_state_callbacks(struct doca_rdma *rdma,
						      doca_rdma_connection_request_cb_t doca_rdma_connect_request_cb,
						      doca_rdma_connection_established_cb_t doca_rdma_connect_established_cb,
						      doca_rdma_connection_failure_cb_t doca_rdma_connect_failure_cb,
						      doca_rdma_connection_disconnection_cb_t doca_rdma_disconnect_cb);

/** Creates an RDMA CM address. */
doca_error_t doca_rdma_addr_create(enum doca_rdma_addr_type addr_type, const char *address, uint16_t port,
				   struct doca_rdma_addr **addr);
/** Destroys an RDMA CM address (BAD_STATE while in use). */
doca_error_t doca_rdma_addr_destroy(struct doca_rdma_addr *addr);

/** Starts listening for RDMA CM requests on a port (running context). */
doca_error_t doca_rdma_start_listen_to_port(struct doca_rdma *rdma, uint16_t port);
/** Stops listening on a port; established connections stay. */
doca_error_t doca_rdma_stop_listen_to_port(struct doca_rdma *rdma, uint16_t port);
/** Connects to a listening peer through RDMA CM (running context). */
doca_error_t doca_rdma_connect_to_addr(struct doca_rdma *rdma, struct doca_rdma_addr *addr,
				       union doca_data connection_user_data);

/** Accepts a connection request. */
doca_error_t doca_rdma_connection_accept(struct doca_rdma_connection *rdma_connection, void *private_data,
					 uint8_t private_data_len);
/** Rejects a connection request. */
doca_error_t doca_rdma_connection_reject(struct doca_rdma_connection *rdma_connection);
/** Disconnects a connection. */
doca_error_t doca_rdma_connection_disconnect(struct doca_rdma_connection *rdma_connection);
/** Sets the user data of a connection. */
doca_error_t doca_rdma_connection_set_user_data(struct doca_rdma_connection *rdma_connection,
						union doca_data connection_user_data);
/** Reads the user data of a connection. */
doca_error_t doca_rdma_connection_get_user_data(const struct doca_rdma_connection *rdma_connection,
						union doca_data *connection_user_data);
/** Reads the id of a connection. */
doca_error_t doca_rdma_connection_get_id(const struct doca_rdma_connection *rdma_connection,
					 uint32_t *connection_id);

/** Out-of-band mode: exports connection details and creates a new connection. */
doca_error_t doca_rdma_export(struct doca_rdma *rdma, const void **local_rdma_conn_details,
			      size_t *local_rdma_conn_details_size, struct doca_rdma_connection **rdma_connection);
/** Out-of-band mode: connects a connection to the remote details. */
doca_error_t doca_rdma_connect(struct doca_rdma *rdma, const void *remote_rdma_conn_details,
			       size_t remote_rdma_conn_details_size, struct doca_rdma_connection *rdma_connection);

/* Capabilities */
/** Whether receive tasks are supported. */
doca_error_t doca_rdma_cap_task_receive_is_supported(const struct doca_devinfo *devinfo);
/** Whether send tasks are supported. */
doca_error_t doca_rdma_cap_task_send_is_supported(const struct doca_devinfo *devinfo);
/** Whether send-with-immediate tasks are supported. */
doca_error_t doca_rdma_cap_task_send_imm_is_supported(const struct doca_devinfo *devinfo);
/** Whether read tasks are supported. */
doca_error_t doca_rdma_cap_task_read_is_supported(const struct doca_devinfo *devinfo);
/** Whether write tasks are supported. */
doca_error_t doca_rdma_cap_task_write_is_supported(const struct doca_devinfo *devinfo);
/** Whether write-with-immediate tasks are supported. */
doca_error_t doca_rdma_cap_task_write_imm_is_supported(const struct doca_devinfo *devinfo);
/** Whether atomic compare-and-swap tasks are supported. */
doca_error_t doca_rdma_cap_task_atomic_cmp_swp_is_supported(const struct doca_devinfo *devinfo);
/** Whether atomic fetch-and-add tasks are supported. */
doca_error_t doca_rdma_cap_task_atomic_fetch_add_is_supported(const struct doca_devinfo *devinfo);
/** Reads the maximum message size. */
doca_error_t doca_rdma_cap_get_max_message_size(const struct doca_devinfo *devinfo, uint32_t *max_message_size);
/** Reads the maximum send queue size (DRIVER when the device cannot be queried). */
doca_error_t doca_rdma_cap_get_max_send_queue_size(const struct doca_devinfo *devinfo, uint32_t *max_send_queue_size);
/** Reads the maximum receive queue size (DRIVER when the device cannot be queried). */
doca_error_t doca_rdma_cap_get_max_recv_queue_size(const struct doca_devinfo *devinfo, uint32_t *max_recv_queue_size);

/* ------------------------------------------------------------------------------------------ */
/* Tasks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Receive */
/** Completion callback of a receive task. */
typedef void (*doca_rdma_task_receive_completion_cb_t)(struct doca_rdma_task_receive *task,
						      union doca_data task_user_data, union doca_data ctx_user_data);
/** Configures receive tasks (idle context). */
doca_error_t doca_rdma_task_receive_set_conf(struct doca_rdma *rdma,
					     doca_rdma_task_receive_completion_cb_t successful_task_completion_cb,
					     doca_rdma_task_receive_completion_cb_t error_task_completion_cb,
					     uint32_t num_tasks);
/** Allocates a receive task; it matches a send from any connection. */
doca_error_t doca_rdma_task_receive_allocate_init(struct doca_rdma *rdma, struct doca_buf *dst_buf,
						  union doca_data user_data, struct doca_rdma_task_receive **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_receive_as_task(struct doca_rdma_task_receive *task);
/** Sets the destination buffer. */
void doca_rdma_task_receive_set_dst_buf(struct doca_rdma_task_receive *task, struct doca_buf *dst_buf);
/** Returns the destination buffer. */
struct doca_buf *doca_rdma_task_receive_get_dst_buf(const struct doca_rdma_task_receive *task);
/** Length of the received message. */
uint32_t doca_rdma_task_receive_get_result_len(const struct doca_rdma_task_receive *task);
/** Opcode of the received message. */
enum doca_rdma_opcode doca_rdma_task_receive_get_result_opcode(const struct doca_rdma_task_receive *task);
/** Immediate value of the received message (big-endian, as sent). */
doca_be32_t doca_rdma_task_receive_get_result_immediate_data(const struct doca_rdma_task_receive *task);
/** The connection the message arrived on. */
const struct doca_rdma_connection *
doca_rdma_task_receive_get_result_rdma_connection(const struct doca_rdma_task_receive *task);

/* Send */
/** Completion callback of a send task. */
typedef void (*doca_rdma_task_send_completion_cb_t)(struct doca_rdma_task_send *task, union doca_data task_user_data,
						   union doca_data ctx_user_data);
/** Configures send tasks (idle context). */
doca_error_t doca_rdma_task_send_set_conf(struct doca_rdma *rdma,
					  doca_rdma_task_send_completion_cb_t successful_task_completion_cb,
					  doca_rdma_task_send_completion_cb_t error_task_completion_cb, uint32_t num_tasks);
/** Allocates a send task on a connection. */
doca_error_t doca_rdma_task_send_allocate_init(struct doca_rdma *rdma, struct doca_rdma_connection *rdma_connection,
					       const struct doca_buf *src_buf, union doca_data user_data,
					       struct doca_rdma_task_send **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_send_as_task(struct doca_rdma_task_send *task);
/** Sets the source buffer. */
void doca_rdma_task_send_set_src_buf(struct doca_rdma_task_send *task, const struct doca_buf *src_buf);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_send_set_rdma_connection(struct doca_rdma_task_send *task,
					     struct doca_rdma_connection *rdma_connection);

/* Send with immediate */
/** Completion callback of a send-with-immediate task. */
typedef void (*doca_rdma_task_send_imm_completion_cb_t)(struct doca_rdma_task_send_imm *task,
						       union doca_data task_user_data, union doca_data ctx_user_data);
/** Configures send-with-immediate tasks (idle context). */
doca_error_t doca_rdma_task_send_imm_set_conf(struct doca_rdma *rdma,
					      doca_rdma_task_send_imm_completion_cb_t successful_task_completion_cb,
					      doca_rdma_task_send_imm_completion_cb_t error_task_completion_cb,
					      uint32_t num_tasks);
/** Allocates a send-with-immediate task on a connection. */
doca_error_t doca_rdma_task_send_imm_allocate_init(struct doca_rdma *rdma,
						   struct doca_rdma_connection *rdma_connection,
						   const struct doca_buf *src_buf, doca_be32_t immediate_data,
						   union doca_data user_data, struct doca_rdma_task_send_imm **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_send_imm_as_task(struct doca_rdma_task_send_imm *task);
/** Sets the source buffer. */
void doca_rdma_task_send_imm_set_src_buf(struct doca_rdma_task_send_imm *task, const struct doca_buf *src_buf);
/** Sets the immediate value. */
void doca_rdma_task_send_imm_set_immediate_data(struct doca_rdma_task_send_imm *task, doca_be32_t immediate_data);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_send_imm_set_rdma_connection(struct doca_rdma_task_send_imm *task,
						 struct doca_rdma_connection *rdma_connection);

/* Read */
/** Completion callback of a read task. */
typedef void (*doca_rdma_task_read_completion_cb_t)(struct doca_rdma_task_read *task, union doca_data task_user_data,
						   union doca_data ctx_user_data);
/** Configures read tasks (idle context). */
doca_error_t doca_rdma_task_read_set_conf(struct doca_rdma *rdma,
					  doca_rdma_task_read_completion_cb_t successful_task_completion_cb,
					  doca_rdma_task_read_completion_cb_t error_task_completion_cb, uint32_t num_tasks);
/** Allocates a read task: remote `src_buf` into local `dst_buf`. */
doca_error_t doca_rdma_task_read_allocate_init(struct doca_rdma *rdma, struct doca_rdma_connection *rdma_connection,
					       const struct doca_buf *src_buf, struct doca_buf *dst_buf,
					       union doca_data user_data, struct doca_rdma_task_read **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_read_as_task(struct doca_rdma_task_read *task);
/** Sets the (remote) source buffer. */
void doca_rdma_task_read_set_src_buf(struct doca_rdma_task_read *task, const struct doca_buf *src_buf);
/** Sets the (local) destination buffer. */
void doca_rdma_task_read_set_dst_buf(struct doca_rdma_task_read *task, struct doca_buf *dst_buf);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_read_set_rdma_connection(struct doca_rdma_task_read *task,
					     struct doca_rdma_connection *rdma_connection);

/* Write */
/** Completion callback of a write task. */
typedef void (*doca_rdma_task_write_completion_cb_t)(struct doca_rdma_task_write *task, union doca_data task_user_data,
						    union doca_data ctx_user_data);
/** Configures write tasks (idle context). */
doca_error_t doca_rdma_task_write_set_conf(struct doca_rdma *rdma,
					   doca_rdma_task_write_completion_cb_t successful_task_completion_cb,
					   doca_rdma_task_write_completion_cb_t error_task_completion_cb, uint32_t num_tasks);
/** Allocates a write task: local `src_buf` into remote `dst_buf`. */
doca_error_t doca_rdma_task_write_allocate_init(struct doca_rdma *rdma, struct doca_rdma_connection *rdma_connection,
						const struct doca_buf *src_buf, struct doca_buf *dst_buf,
						union doca_data user_data, struct doca_rdma_task_write **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_write_as_task(struct doca_rdma_task_write *task);
/** Sets the (local) source buffer. */
void doca_rdma_task_write_set_src_buf(struct doca_rdma_task_write *task, const struct doca_buf *src_buf);
/** Sets the (remote) destination buffer. */
void doca_rdma_task_write_set_dst_buf(struct doca_rdma_task_write *task, struct doca_buf *dst_buf);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_write_set_rdma_connection(struct doca_rdma_task_write *task,
					      struct doca_rdma_connection *rdma_connection);

/* Write with immediate */
/** Completion callback of a write-with-immediate task. */
typedef void (*doca_rdma_task_write_imm_completion_cb_t)(struct doca_rdma_task_write_imm *task,
							union doca_data task_user_data, union doca_data ctx_user_data);
/** Configures write-with-immediate tasks (idle context). */
doca_error_t doca_rdma_task_write_imm_set_conf(struct doca_rdma *rdma,
					       doca_rdma_task_write_imm_completion_cb_t successful_task_completion_cb,
					       doca_rdma_task_write_imm_completion_cb_t error_task_completion_cb,
					       uint32_t num_tasks);
/** Allocates a write-with-immediate task. */
doca_error_t doca_rdma_task_write_imm_allocate_init(struct doca_rdma *rdma,
						    struct doca_rdma_connection *rdma_connection,
						    const struct doca_buf *src_buf, struct doca_buf *dst_buf,
						    doca_be32_t immediate_data, union doca_data user_data,
						    struct doca_rdma_task_write_imm **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_write_imm_as_task(struct doca_rdma_task_write_imm *task);
/** Sets the (local) source buffer. */
void doca_rdma_task_write_imm_set_src_buf(struct doca_rdma_task_write_imm *task, const struct doca_buf *src_buf);
/** Sets the (remote) destination buffer. */
void doca_rdma_task_write_imm_set_dst_buf(struct doca_rdma_task_write_imm *task, struct doca_buf *dst_buf);
/** Sets the immediate value. */
void doca_rdma_task_write_imm_set_immediate_data(struct doca_rdma_task_write_imm *task, doca_be32_t immediate_data);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_write_imm_set_rdma_connection(struct doca_rdma_task_write_imm *task,
						  struct doca_rdma_connection *rdma_connection);

/* Atomic compare and swap */
/** Completion callback of an atomic compare-and-swap task. */
typedef void (*doca_rdma_task_atomic_cmp_swp_completion_cb_t)(struct doca_rdma_task_atomic_cmp_swp *task,
							     union doca_data task_user_data,
							     union doca_data ctx_user_data);
/** Configures atomic compare-and-swap tasks (idle context). */
doca_error_t doca_rdma_task_atomic_cmp_swp_set_conf(struct doca_rdma *rdma,
						    doca_rdma_task_atomic_cmp_swp_completion_cb_t successful_task_completion_cb,
						    doca_rdma_task_atomic_cmp_swp_completion_cb_t error_task_completion_cb,
						    uint32_t num_tasks);
/** Allocates an atomic compare-and-swap task on 8 remote bytes. */
doca_error_t doca_rdma_task_atomic_cmp_swp_allocate_init(struct doca_rdma *rdma,
							 struct doca_rdma_connection *rdma_connection,
							 struct doca_buf *dst_buf, struct doca_buf *result_buf,
							 uint64_t cmp_data, uint64_t swap_data, union doca_data user_data,
							 struct doca_rdma_task_atomic_cmp_swp **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_atomic_cmp_swp_as_task(struct doca_rdma_task_atomic_cmp_swp *task);
/** Sets the (remote) destination buffer: its first 8 bytes of data are the target (DOCA 3.x). */
void doca_rdma_task_atomic_cmp_swp_set_dst_buf(struct doca_rdma_task_atomic_cmp_swp *task, struct doca_buf *dst_buf);
/** Sets the (local) buffer that receives the previous remote value (DOCA 3.x). */
void doca_rdma_task_atomic_cmp_swp_set_result_buf(struct doca_rdma_task_atomic_cmp_swp *task,
						  struct doca_buf *result_buf);
/** Sets the value compared with the remote value (DOCA 3.x). */
void doca_rdma_task_atomic_cmp_swp_set_cmp_data(struct doca_rdma_task_atomic_cmp_swp *task, uint64_t cmp_data);
/** Sets the value stored when the comparison matches (DOCA 3.x). */
void doca_rdma_task_atomic_cmp_swp_set_swap_data(struct doca_rdma_task_atomic_cmp_swp *task, uint64_t swap_data);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_atomic_cmp_swp_set_rdma_connection(struct doca_rdma_task_atomic_cmp_swp *task,
						       struct doca_rdma_connection *rdma_connection);

/* Atomic fetch and add */
/** Completion callback of an atomic fetch-and-add task. */
typedef void (*doca_rdma_task_atomic_fetch_add_completion_cb_t)(struct doca_rdma_task_atomic_fetch_add *task,
							       union doca_data task_user_data,
							       union doca_data ctx_user_data);
/** Configures atomic fetch-and-add tasks (idle context). */
doca_error_t doca_rdma_task_atomic_fetch_add_set_conf(struct doca_rdma *rdma,
						      doca_rdma_task_atomic_fetch_add_completion_cb_t successful_task_completion_cb,
						      doca_rdma_task_atomic_fetch_add_completion_cb_t error_task_completion_cb,
						      uint32_t num_tasks);
/** Allocates an atomic fetch-and-add task on 8 remote bytes. */
doca_error_t doca_rdma_task_atomic_fetch_add_allocate_init(struct doca_rdma *rdma,
							   struct doca_rdma_connection *rdma_connection,
							   struct doca_buf *dst_buf, struct doca_buf *result_buf,
							   uint64_t add_data, union doca_data user_data,
							   struct doca_rdma_task_atomic_fetch_add **task);
/** Returns the generic task. */
struct doca_task *doca_rdma_task_atomic_fetch_add_as_task(struct doca_rdma_task_atomic_fetch_add *task);
/** Sets the (remote) destination buffer: its first 8 bytes of data are the target (DOCA 3.x). */
void doca_rdma_task_atomic_fetch_add_set_dst_buf(struct doca_rdma_task_atomic_fetch_add *task,
						 struct doca_buf *dst_buf);
/** Sets the (local) buffer that receives the previous remote value (DOCA 3.x). */
void doca_rdma_task_atomic_fetch_add_set_result_buf(struct doca_rdma_task_atomic_fetch_add *task,
						    struct doca_buf *result_buf);
/** Sets the value added to the remote value (DOCA 3.x). */
void doca_rdma_task_atomic_fetch_add_set_add_data(struct doca_rdma_task_atomic_fetch_add *task, uint64_t add_data);
/** Sets the connection the task runs on (DOCA 3.x). */
void doca_rdma_task_atomic_fetch_add_set_rdma_connection(struct doca_rdma_task_atomic_fetch_add *task,
							 struct doca_rdma_connection *rdma_connection);

/* ------------------------------------------------------------------------------------------ */
/* Memory (doca_mmap.h, doca_buf_inventory.h, doca_buf.h)                                     */
/* ------------------------------------------------------------------------------------------ */

/** Creates a memory map. */
doca_error_t doca_mmap_create(struct doca_mmap **mmap);
/** Destroys a memory map. */
doca_error_t doca_mmap_destroy(struct doca_mmap *mmap);
/** Starts a memory map. */
doca_error_t doca_mmap_start(struct doca_mmap *mmap);
/** Stops a memory map. */
doca_error_t doca_mmap_stop(struct doca_mmap *mmap);
/** Sets the memory range (before start). */
doca_error_t doca_mmap_set_memrange(struct doca_mmap *mmap, void *addr, size_t len);
/** Sets the access permissions (before start). */
doca_error_t doca_mmap_set_permissions(struct doca_mmap *mmap, uint32_t access_mask);
/** Adds a device (before start). */
doca_error_t doca_mmap_add_dev(struct doca_mmap *mmap, struct doca_dev *dev);
/** Exports a started memory map for RDMA access by a peer. */
doca_error_t doca_mmap_export_rdma(struct doca_mmap *mmap, const struct doca_dev *dev, const void **export_desc,
				   size_t *export_desc_len);
/** Creates a memory map from a peer's export. */
doca_error_t doca_mmap_create_from_export(const union doca_data *user_data, const void *export_desc,
					  size_t export_desc_len, struct doca_dev *dev, struct doca_mmap **mmap);

/** Creates a buffer inventory. */
doca_error_t doca_buf_inventory_create(size_t num_elements, struct doca_buf_inventory **buf_inventory);
/** Destroys a buffer inventory (IN_USE while buffers are out). */
doca_error_t doca_buf_inventory_destroy(struct doca_buf_inventory *inventory);
/** Starts a buffer inventory. */
doca_error_t doca_buf_inventory_start(struct doca_buf_inventory *inventory);
/** Stops a buffer inventory. */
doca_error_t doca_buf_inventory_stop(struct doca_buf_inventory *inventory);
/** Adds elements to a started buffer inventory. */
doca_error_t doca_buf_inventory_expand(struct doca_buf_inventory *inventory, uint32_t num_elements);
/** Takes a buffer describing `[addr, addr + len)` with data section `[data, data + data_len)`. */
doca_error_t doca_buf_inventory_buf_get_by_args(struct doca_buf_inventory *inventory, struct doca_mmap *mmap,
						void *addr, size_t len, void *data, size_t data_len, struct doca_buf **buf);

/** Decrements the reference count; the buffer returns to its inventory at zero. */
doca_error_t doca_buf_dec_refcount(struct doca_buf *buf, uint16_t *refcount);
/** Reads the data pointer. */
doca_error_t doca_buf_get_data(const struct doca_buf *buf, void **data);
/** Reads the data length. */
doca_error_t doca_buf_get_data_len(const struct doca_buf *buf, size_t *data_len);
/** Sets the data section. */
doca_error_t doca_buf_set_data(struct doca_buf *buf, void *data, size_t data_len);
/** Sets the data length to zero. */
doca_error_t doca_buf_reset_data_len(struct doca_buf *buf);

#ifdef __cplusplus
}
#endif

#endif /* DOCA_RPC_SW_H */
